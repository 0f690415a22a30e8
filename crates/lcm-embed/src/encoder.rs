//! The transformer encoders of the sentence-transformers models lcm loads, on candle's
//! tensors, with the weights' Hugging Face names: **BERT** (all-MiniLM-L6-v2, E5, GTE, BGE:
//! absolute positions from 0, token types, post-layer-norm blocks), computing what
//! `transformers`' `BertModel` computes, and **MPNet** (all-mpnet-base-v2), computing what its
//! `MPNetModel` computes: the same blocks without token types, positions counted from the
//! padding id plus one, and a relative-position bias added to every layer's attention scores
//! (T5's buckets, one learned value a bucket and head, shared by the layers).
//!
//! **Why not candle-transformers' `BertModel`**: a search embeds its query alone, a dozen word
//! pieces, and then every linear layer multiplies a dozen rows by a weight matrix. candle's
//! matrix product (the `gemm` crate) first copies the whole weight matrix into its panel layout,
//! reading the transposed weights one strided float at a time: for a query that copy was most
//! of the forward pass (docs/PERFORMANCE.md, "Hybrid recall"). Here a linear layer with few
//! rows ([`THIN_ROWS`] or fewer) takes [`kernels::thin_product`], which reads the weights as
//! they are stored, once; larger inputs (the index's batches) keep candle's product, which is
//! faster there. GELU is [`kernels::gelu_erf`]. Attention takes a text at a time over its
//! real word pieces (`Layer::attend`), where candle-transformers scores a whole padded batch
//! and masks the padding. Everything else is candle's operations, as candle-transformers
//! composes them.

use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::{Embedding, LayerNorm, VarBuilder};
use serde::Deserialize;

use crate::kernels;

/// Rows (word pieces of a batch) up to which a linear layer takes [`kernels::thin_product`]
/// instead of candle's matrix product (see the module doc; measured crossover in
/// docs/PERFORMANCE.md).
pub(crate) const THIN_ROWS: usize = 64;

/// The fields of `config.json` the encoder needs.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct Config {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    pub hidden_act: String,
    pub max_position_embeddings: usize,
    /// BERT's token types (MPNet has none).
    #[serde(default)]
    pub type_vocab_size: Option<usize>,
    pub layer_norm_eps: f64,
    #[serde(default)]
    pub position_embedding_type: Option<String>,
    /// `transformers`' architecture name: "bert" or "mpnet". RoBERTa-family models (XLM-R:
    /// multilingual E5) share BERT's weight names but count positions from 2, so they are
    /// refused by name.
    #[serde(default)]
    pub model_type: Option<String>,
    /// MPNet's buckets of relative positions (32 in `transformers`' default configuration).
    #[serde(default)]
    pub relative_attention_num_buckets: Option<usize>,
    /// MPNet counts positions from this id plus one (1 in every released MPNet).
    #[serde(default)]
    pub pad_token_id: Option<u32>,
    /// `transformers`' model classes the weights are for (`BertModel`,
    /// `BertForSequenceClassification`, ...), when the file names them.
    #[serde(default)]
    pub architectures: Vec<String>,
}

/// The encoders this module computes (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Family {
    Bert,
    MpNet,
}

impl Config {
    /// Whether the file describes a cross-encoder: a model with a classification head that
    /// scores a pair of texts (`...ForSequenceClassification`), not one that embeds a text.
    pub fn is_cross_encoder(&self) -> bool {
        self.architectures
            .iter()
            .any(|a| a.ends_with("ForSequenceClassification"))
    }

    /// The encoder this configuration describes (`model_type` absent: BERT, as older
    /// sentence-transformers directories have it), or why it is not one this module computes
    /// faithfully.
    pub(crate) fn family(&self) -> std::result::Result<Family, String> {
        let family = match self.model_type.as_deref() {
            None | Some("bert") => Family::Bert,
            Some("mpnet") => Family::MpNet,
            Some(other) => {
                return Err(format!(
                    "model_type {other:?} is not supported (\"bert\" or \"mpnet\")"
                ));
            }
        };
        if Activation::named(&self.hidden_act).is_none() {
            return Err(format!(
                "hidden_act {:?} is not supported (gelu, gelu_new, gelu_pytorch_tanh or relu)",
                self.hidden_act
            ));
        }
        if let Some(kind) = &self.position_embedding_type
            && kind != "absolute"
        {
            return Err(format!(
                "position_embedding_type {kind:?} is not supported (absolute only)"
            ));
        }
        if self.num_attention_heads == 0
            || !self.hidden_size.is_multiple_of(self.num_attention_heads)
        {
            return Err(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if family == Family::Bert && self.type_vocab_size.is_none() {
            return Err("type_vocab_size is missing (BERT has token types)".into());
        }
        if family == Family::MpNet && self.buckets() < 2 {
            return Err(format!(
                "relative_attention_num_buckets {} is too few (2 at least)",
                self.buckets()
            ));
        }
        Ok(family)
    }

    /// The most word pieces the encoder of `family` has positions for.
    pub(crate) fn positions(&self, family: Family) -> usize {
        self.max_position_embeddings
            .saturating_sub(self.first_position(family) as usize)
    }

    fn buckets(&self) -> usize {
        self.relative_attention_num_buckets.unwrap_or(32)
    }

    /// The position id of the first word piece: 0 for BERT, the padding id plus one for MPNet.
    fn first_position(&self, family: Family) -> u32 {
        match family {
            Family::Bert => 0,
            Family::MpNet => self.pad_token_id.unwrap_or(1) + 1,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Activation {
    /// GELU with the exact error function (`transformers`' "gelu").
    Gelu,
    /// GELU's tanh approximation ("gelu_new", "gelu_pytorch_tanh").
    GeluTanh,
    Relu,
}

impl Activation {
    fn named(name: &str) -> Option<Activation> {
        match name {
            "gelu" => Some(Activation::Gelu),
            "gelu_new" | "gelu_pytorch_tanh" => Some(Activation::GeluTanh),
            "relu" => Some(Activation::Relu),
            _ => None,
        }
    }

    fn forward(self, xs: &Tensor) -> Result<Tensor> {
        match self {
            Activation::Gelu => kernels::gelu_erf(xs),
            Activation::GeluTanh => xs.gelu(),
            Activation::Relu => xs.relu(),
        }
    }
}

/// A dense layer `x · Wᵀ + b` (see the module doc for its two ways of computing).
pub(crate) struct Linear {
    /// `(out, in)`, contiguous, f32, on the CPU.
    weight: Tensor,
    bias: Tensor,
    bias_values: Vec<f32>,
    inputs: usize,
    outputs: usize,
}

impl Linear {
    pub(crate) fn load(inputs: usize, outputs: usize, vb: VarBuilder) -> Result<Linear> {
        let weight = vb.get((outputs, inputs), "weight")?.contiguous()?;
        let bias = vb.get(outputs, "bias")?;
        Ok(Linear {
            weight,
            bias_values: bias.to_vec1()?,
            bias,
            inputs,
            outputs,
        })
    }

    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut dims = x.dims().to_vec();
        let rows = x.elem_count() / self.inputs;
        let flat = x.reshape((rows, self.inputs))?;
        let y = if rows <= THIN_ROWS {
            self.thin(&flat, rows)?
        } else {
            flat.matmul(&self.weight.t()?)?.broadcast_add(&self.bias)?
        };
        if let Some(last) = dims.last_mut() {
            *last = self.outputs;
        }
        y.reshape(dims)
    }

    /// `rows` rows by [`kernels::thin_product`] (on the current rayon pool).
    fn thin(&self, x: &Tensor, rows: usize) -> Result<Tensor> {
        let x: Vec<f32> = x.flatten_all()?.to_vec1()?;
        let (storage, layout) = self.weight.storage_and_layout();
        let candle_core::Storage::Cpu(cpu) = &*storage else {
            candle_core::bail!("the encoder's weights are not on the CPU");
        };
        let start = layout.start_offset();
        let weight = &cpu.as_slice::<f32>()?[start..start + self.inputs * self.outputs];
        let out = kernels::thin_product(
            &x,
            rows,
            weight,
            &self.bias_values,
            self.inputs,
            self.outputs,
        );
        Tensor::from_vec(out, (rows, self.outputs), &Device::Cpu)
    }
}

fn layer_norm(size: usize, eps: f64, vb: VarBuilder) -> Result<LayerNorm> {
    Ok(LayerNorm::new(
        vb.get(size, "weight")?,
        vb.get(size, "bias")?,
        eps,
    ))
}

fn embedding(count: usize, size: usize, vb: VarBuilder) -> Result<Embedding> {
    Ok(Embedding::new(vb.get((count, size), "weight")?, size))
}

struct Embeddings {
    words: Embedding,
    positions: Embedding,
    /// BERT's; MPNet has none.
    token_types: Option<Embedding>,
    first_position: u32,
    norm: LayerNorm,
}

impl Embeddings {
    fn load(vb: VarBuilder, c: &Config, family: Family) -> Result<Embeddings> {
        let token_types = match (family, c.type_vocab_size) {
            (Family::Bert, Some(types)) => Some(embedding(
                types,
                c.hidden_size,
                vb.pp("token_type_embeddings"),
            )?),
            (Family::Bert, None) => candle_core::bail!("type_vocab_size is missing"),
            (Family::MpNet, _) => None,
        };
        Ok(Embeddings {
            words: embedding(c.vocab_size, c.hidden_size, vb.pp("word_embeddings"))?,
            positions: embedding(
                c.max_position_embeddings,
                c.hidden_size,
                vb.pp("position_embeddings"),
            )?,
            token_types,
            first_position: c.first_position(family),
            norm: layer_norm(c.hidden_size, c.layer_norm_eps, vb.pp("LayerNorm"))?,
        })
    }

    /// The word pieces of every text start at the batch's first column and padding follows
    /// them, so position `i` is `first_position + i` for every real piece (MPNet gives padding
    /// the padding id's position instead, which the attention mask and the pooling never read).
    fn forward(&self, ids: &Tensor, types: &Tensor) -> Result<Tensor> {
        let (_, len) = ids.dims2()?;
        let first = self.first_position;
        let positions = Tensor::arange(first, first + len as u32, ids.device())?;
        let mut x = self.words.forward(ids)?;
        if let Some(token_types) = &self.token_types {
            x = (x + token_types.forward(types)?)?;
        }
        let x = x.broadcast_add(&self.positions.forward(&positions)?)?;
        self.norm.forward(&x)
    }
}

struct Layer {
    query: Linear,
    key: Linear,
    value: Linear,
    attention_out: Linear,
    attention_norm: LayerNorm,
    intermediate: Linear,
    output: Linear,
    output_norm: LayerNorm,
    activation: Activation,
    heads: usize,
    head_size: usize,
}

impl Layer {
    fn load(vb: VarBuilder, c: &Config, family: Family) -> Result<Layer> {
        let h = c.hidden_size;
        let attention = vb.pp("attention");
        let activation = Activation::named(&c.hidden_act)
            .ok_or_else(|| candle_core::Error::Msg(format!("hidden_act {}", c.hidden_act)))?;
        // The same four projections and norm under each family's names.
        let (q, k, v, out, norm) = match family {
            Family::Bert => (
                attention.pp("self").pp("query"),
                attention.pp("self").pp("key"),
                attention.pp("self").pp("value"),
                attention.pp("output").pp("dense"),
                attention.pp("output").pp("LayerNorm"),
            ),
            Family::MpNet => (
                attention.pp("attn").pp("q"),
                attention.pp("attn").pp("k"),
                attention.pp("attn").pp("v"),
                attention.pp("attn").pp("o"),
                attention.pp("LayerNorm"),
            ),
        };
        Ok(Layer {
            query: Linear::load(h, h, q)?,
            key: Linear::load(h, h, k)?,
            value: Linear::load(h, h, v)?,
            attention_out: Linear::load(h, h, out)?,
            attention_norm: layer_norm(h, c.layer_norm_eps, norm)?,
            intermediate: Linear::load(h, c.intermediate_size, vb.pp("intermediate").pp("dense"))?,
            output: Linear::load(c.intermediate_size, h, vb.pp("output").pp("dense"))?,
            output_norm: layer_norm(h, c.layer_norm_eps, vb.pp("output").pp("LayerNorm"))?,
            activation,
            heads: c.num_attention_heads,
            head_size: h / c.num_attention_heads,
        })
    }

    /// `(batch, len, hidden)` → `(batch, len, heads, head_size)` → `(batch, heads, len, head_size)`.
    fn by_head(&self, x: &Tensor) -> Result<Tensor> {
        let (b, len, _) = x.dims3()?;
        x.reshape((b, len, self.heads, self.head_size))?
            .transpose(1, 2)?
            .contiguous()
    }

    /// `shape` says which word pieces of each text are real, and MPNet's relative-position
    /// bias.
    fn forward(&self, x: &Tensor, shape: &Attention) -> Result<Tensor> {
        let q = self.by_head(&self.query.forward(x)?)?;
        let k = self.by_head(&self.key.forward(x)?)?;
        let v = self.by_head(&self.value.forward(x)?)?;
        let context = self.attend(&q, &k, &v, shape)?;
        let attended = self
            .attention_norm
            .forward(&(self.attention_out.forward(&context)? + x)?)?;
        let inner = self
            .activation
            .forward(&self.intermediate.forward(&attended)?)?;
        self.output_norm
            .forward(&(self.output.forward(&inner)? + attended)?)
    }

    /// Scaled dot-product attention, `(batch, heads, len, head_size)` each → `(batch, len,
    /// hidden)`, one text at a time over its real word pieces only. The padding's keys would
    /// get a weight of exactly 0 after the softmax (`transformers` adds `f32::MIN` to their
    /// scores) and the padding's own rows are never read (the next layer's attention skips them
    /// too, and pooling masks them), so leaving both out computes the same states; the padding
    /// rows come out as zeros. A batch's score tensors were `batch × heads × len × len` floats,
    /// three of them alive at once (a hundred megabytes each for 32 texts of 256 pieces): one
    /// text's are `heads × n × n`, freed before the next (docs/PERFORMANCE.md, "Attention a
    /// text at a time").
    fn attend(&self, q: &Tensor, k: &Tensor, v: &Tensor, shape: &Attention) -> Result<Tensor> {
        use rayon::prelude::*;
        let (_, _, len, _) = q.dims4()?;
        let scale = (self.head_size as f64).sqrt();
        let weigh = |q: &Tensor, k: &Tensor, relative: Option<&Tensor>| -> Result<Tensor> {
            let mut scores = (q.matmul(&k.t()?)? / scale)?;
            if let Some(relative) = relative {
                scores = scores.broadcast_add(relative)?;
            }
            candle_nn::ops::softmax_last_dim(&scores)
        };
        if shape.lengths.iter().all(|&n| n == len) {
            // No padding (a query, or texts of one length): the whole batch at once.
            return weigh(q, k, shape.relative.as_ref())?
                .matmul(v)?
                .transpose(1, 2)?
                .contiguous()?
                .flatten_from(2);
        }
        let texts: Vec<Tensor> = shape
            .lengths
            .par_iter()
            .enumerate()
            .map(|(text, &n)| {
                if n == 0 {
                    return Tensor::zeros(
                        (len, self.heads * self.head_size),
                        q.dtype(),
                        q.device(),
                    );
                }
                let real = |t: &Tensor| t.get(text)?.narrow(1, 0, n)?.contiguous();
                let (q, k, v) = (real(q)?, real(k)?, real(v)?);
                let relative = match &shape.relative {
                    Some(relative) => Some(relative.narrow(1, 0, n)?.narrow(2, 0, n)?),
                    None => None,
                };
                weigh(&q, &k, relative.as_ref())?
                    .matmul(&v)?
                    .transpose(0, 1)?
                    .contiguous()?
                    .flatten_from(1)?
                    .pad_with_zeros(0, 0, len - n)
            })
            .collect::<Result<_>>()?;
        Tensor::stack(&texts, 0)
    }
}

/// What every layer's attention needs to know of a batch besides its states.
struct Attention {
    /// The real word pieces of each text (they come first in its row; padding follows).
    lengths: Vec<usize>,
    /// MPNet's relative-position bias, `(heads, len, len)`.
    relative: Option<Tensor>,
}

/// The most distance MPNet's buckets tell apart (`transformers`' `max_distance`).
const MAX_DISTANCE: i64 = 128;

/// MPNet's bucket of a relative position (`key - query`), as `transformers`'
/// `MPNetEncoder.relative_position_bucket` computes it: half the buckets for keys before the
/// query, half for keys after; within each, a bucket a position up to a quarter of the
/// buckets, then buckets whose width grows with the log of the distance up to
/// [`MAX_DISTANCE`], then the last bucket. The log is taken in f32, as torch does, so the
/// buckets' bounds are the same.
fn relative_bucket(relative: i64, buckets: usize) -> u32 {
    let half = (buckets / 2) as i64;
    let n = -relative;
    let mut bucket = if n < 0 { half } else { 0 };
    let n = n.abs();
    let exact = half / 2;
    if n < exact {
        bucket += n;
    } else {
        let log_ratio = (n as f32 / exact as f32).ln();
        let log_range = (MAX_DISTANCE as f64 / exact as f64).ln() as f32;
        let large = exact + (log_ratio / log_range * (half - exact) as f32) as i64;
        bucket += large.min(half - 1);
    }
    bucket as u32
}

/// MPNet's relative-position bias: one learned value a bucket and head.
struct RelativeBias {
    /// `(buckets, heads)`.
    values: Embedding,
    buckets: usize,
}

impl RelativeBias {
    /// `(heads, len, len)`: the bias of each query (row) and key (column).
    fn forward(&self, len: usize, device: &Device) -> Result<Tensor> {
        let mut buckets = Vec::with_capacity(len * len);
        for query in 0..len as i64 {
            for key in 0..len as i64 {
                buckets.push(relative_bucket(key - query, self.buckets));
            }
        }
        let buckets = Tensor::from_vec(buckets, (len, len), device)?;
        self.values
            .forward(&buckets)?
            .permute((2, 0, 1))?
            .contiguous()
    }
}

/// A BERT or MPNet encoder: embeddings and layers (no pooler: sentence-transformers pools the
/// last hidden states itself).
pub(crate) struct Encoder {
    embeddings: Embeddings,
    layers: Vec<Layer>,
    relative_bias: Option<RelativeBias>,
}

impl Encoder {
    /// Loads the weights `vb` holds (at its root, or under `bert.` or `mpnet.`).
    pub(crate) fn load(vb: VarBuilder, c: &Config) -> Result<Encoder> {
        let family = c.family().map_err(candle_core::Error::Msg)?;
        let prefix = match family {
            Family::Bert => "bert",
            Family::MpNet => "mpnet",
        };
        let vb = if vb.contains_tensor(&format!("{prefix}.embeddings.word_embeddings.weight")) {
            vb.pp(prefix)
        } else {
            vb
        };
        let encoder = vb.pp("encoder");
        let relative_bias = match family {
            Family::Bert => None,
            Family::MpNet => Some(RelativeBias {
                values: embedding(
                    c.buckets(),
                    c.num_attention_heads,
                    encoder.pp("relative_attention_bias"),
                )?,
                buckets: c.buckets(),
            }),
        };
        Ok(Encoder {
            embeddings: Embeddings::load(vb.pp("embeddings"), c, family)?,
            layers: (0..c.num_hidden_layers)
                .map(|i| Layer::load(encoder.pp(format!("layer.{i}")), c, family))
                .collect::<Result<_>>()?,
            relative_bias,
        })
    }

    /// The last hidden states, `(batch, len, hidden)`, of token ids `(batch, len)` with their
    /// token types (BERT's; MPNet ignores them) and attention mask (1 for a real token, 0 for
    /// padding).
    pub(crate) fn forward(&self, ids: &Tensor, types: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let mut x = self.embeddings.forward(ids, types)?;
        // Each text's word pieces start at the batch's first column (`Embeddings::forward`), so
        // the mask's sum is where its padding starts.
        let lengths = mask
            .to_dtype(DType::U32)?
            .sum(1)?
            .to_vec1::<u32>()?
            .into_iter()
            .map(|n| n as usize)
            .collect();
        let relative = match &self.relative_bias {
            // Computed once for every layer, as `transformers` does.
            Some(relative) => {
                let (_, len) = ids.dims2()?;
                Some(relative.forward(len, ids.device())?)
            }
            None => None,
        };
        let shape = Attention { lengths, relative };
        for layer in &self.layers {
            x = layer.forward(&x, &shape)?;
        }
        Ok(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The buckets of relative positions -600..=600 are those `transformers` computes (its
    /// `MPNetEncoder.relative_position_bucket` over the same range, run once: each bucket's
    /// first and last position below).
    #[test]
    fn relative_buckets_are_those_of_transformers() {
        let torch: [(u32, i64, i64); 30] = [
            (0, 0, 0),
            (1, -1, -1),
            (2, -2, -2),
            (3, -3, -3),
            (4, -4, -4),
            (5, -5, -5),
            (6, -6, -6),
            (7, -7, -7),
            (8, -11, -8),
            (9, -15, -12),
            (10, -22, -16),
            (11, -31, -23),
            (12, -45, -32),
            (13, -63, -46),
            (14, -90, -64),
            (15, -600, -91),
            (17, 1, 1),
            (18, 2, 2),
            (19, 3, 3),
            (20, 4, 4),
            (21, 5, 5),
            (22, 6, 6),
            (23, 7, 7),
            (24, 8, 11),
            (25, 12, 15),
            (26, 16, 22),
            (27, 23, 31),
            (28, 32, 45),
            (29, 46, 63),
            (30, 64, 90),
        ];
        for relative in -600..=600i64 {
            let expected = torch
                .iter()
                .find(|(_, low, high)| (*low..=*high).contains(&relative))
                .map_or(31, |(bucket, _, _)| *bucket);
            assert_eq!(
                relative_bucket(relative, 32),
                expected,
                "position {relative}"
            );
        }
    }

    #[test]
    fn both_ways_of_a_linear_layer_agree() {
        let (inputs, outputs) = (96, 200);
        let values = |n: usize, seed: usize| -> Vec<f32> {
            (0..n)
                .map(|i| (((i + seed) * 2_654_435_761) % 1000) as f32 / 500.0 - 1.0)
                .collect()
        };
        let weight =
            Tensor::from_vec(values(inputs * outputs, 1), (outputs, inputs), &Device::Cpu).unwrap();
        let bias = Tensor::from_vec(values(outputs, 2), outputs, &Device::Cpu).unwrap();
        let linear = Linear {
            bias_values: bias.to_vec1().unwrap(),
            weight,
            bias,
            inputs,
            outputs,
        };
        for rows in [1, 7, THIN_ROWS, THIN_ROWS + 1] {
            let x = Tensor::from_vec(values(rows * inputs, rows), (1, rows, inputs), &Device::Cpu)
                .unwrap();
            let y = linear.forward(&x).unwrap();
            assert_eq!(y.dims(), [1, rows, outputs]);
            let reference = x
                .reshape((rows, inputs))
                .unwrap()
                .matmul(&linear.weight.t().unwrap())
                .unwrap()
                .broadcast_add(&linear.bias)
                .unwrap();
            let thin = linear
                .thin(&x.reshape((rows, inputs)).unwrap(), rows)
                .unwrap();
            let (y, reference, thin): (Vec<f32>, Vec<f32>, Vec<f32>) = (
                y.flatten_all().unwrap().to_vec1().unwrap(),
                reference.flatten_all().unwrap().to_vec1().unwrap(),
                thin.flatten_all().unwrap().to_vec1().unwrap(),
            );
            for ((a, b), c) in y.iter().zip(&reference).zip(&thin) {
                assert!(
                    (a - b).abs() < 1e-4 && (c - b).abs() < 1e-4,
                    "{rows} rows: {a} {b} {c}"
                );
            }
            // Each output is a real product, not zero.
            assert!(reference.iter().any(|v| v.abs() > 1.0));
        }
    }
}
