//! BERT's encoder on candle's tensors: the architecture of the sentence-transformers models
//! lcm loads (all-MiniLM-L6-v2 among them), with the weights' Hugging Face names, computing
//! what `transformers`' `BertModel` computes (absolute positions, post-layer-norm blocks).
//!
//! **Why not candle-transformers' `BertModel`**: a search embeds its query alone, a dozen word
//! pieces, and then every linear layer multiplies a dozen rows by a weight matrix. candle's
//! matrix product (the `gemm` crate) first copies the whole weight matrix into its panel layout,
//! reading the transposed weights one strided float at a time: for a query that copy was most
//! of the forward pass (docs/PERFORMANCE.md, "Hybrid recall"). Here a linear layer with few
//! rows ([`THIN_ROWS`] or fewer) takes dot products of each input row with each weight row,
//! both contiguous, reading every weight once; larger inputs (the index's batches) keep
//! candle's product, which is faster there. Everything else is candle's operations, as
//! candle-transformers composes them.

use candle_core::{DType, Device, Module, Result, Tensor};
use candle_nn::{Embedding, LayerNorm, VarBuilder};
use rayon::prelude::*;
use serde::Deserialize;

/// Rows (word pieces of a batch) up to which a linear layer takes row-by-row dot products
/// instead of candle's matrix product (see the module doc; measured crossover in
/// docs/PERFORMANCE.md).
pub(crate) const THIN_ROWS: usize = 64;
/// Output columns one task of the row-by-row product computes.
const COLUMNS_PER_TASK: usize = 64;

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
    pub type_vocab_size: usize,
    pub layer_norm_eps: f64,
    #[serde(default)]
    pub position_embedding_type: Option<String>,
    /// `transformers`' architecture name: RoBERTa-family models (XLM-R: multilingual E5)
    /// share BERT's weight names but count positions from 2, so they are refused by name.
    #[serde(default)]
    pub model_type: Option<String>,
}

impl Config {
    /// Why this configuration is not one the encoder computes faithfully, if it is not.
    pub(crate) fn unsupported(&self) -> Option<String> {
        if let Some(kind) = &self.model_type
            && kind != "bert"
        {
            return Some(format!(
                "model_type {kind:?} is not supported (BERT only: \"bert\")"
            ));
        }
        if Activation::named(&self.hidden_act).is_none() {
            return Some(format!(
                "hidden_act {:?} is not supported (gelu, gelu_new, gelu_pytorch_tanh or relu)",
                self.hidden_act
            ));
        }
        if let Some(kind) = &self.position_embedding_type
            && kind != "absolute"
        {
            return Some(format!(
                "position_embedding_type {kind:?} is not supported (absolute only)"
            ));
        }
        if self.num_attention_heads == 0
            || !self.hidden_size.is_multiple_of(self.num_attention_heads)
        {
            return Some(format!(
                "hidden_size {} is not a multiple of num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        None
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
            Activation::Gelu => xs.gelu_erf(),
            Activation::GeluTanh => xs.gelu(),
            Activation::Relu => xs.relu(),
        }
    }
}

/// A dense layer `x · Wᵀ + b` (see the module doc for its two ways of computing).
struct Linear {
    /// `(out, in)`, contiguous, f32, on the CPU.
    weight: Tensor,
    bias: Tensor,
    bias_values: Vec<f32>,
    inputs: usize,
    outputs: usize,
}

impl Linear {
    fn load(inputs: usize, outputs: usize, vb: VarBuilder) -> Result<Linear> {
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

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
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

    /// `rows` rows by dot products with each weight row (on the current rayon pool).
    fn thin(&self, x: &Tensor, rows: usize) -> Result<Tensor> {
        let x: Vec<f32> = x.flatten_all()?.to_vec1()?;
        let (storage, layout) = self.weight.storage_and_layout();
        let candle_core::Storage::Cpu(cpu) = &*storage else {
            candle_core::bail!("the encoder's weights are not on the CPU");
        };
        let start = layout.start_offset();
        let weight = &cpu.as_slice::<f32>()?[start..start + self.inputs * self.outputs];
        let inputs = self.inputs;
        // By column: `by_column[j * rows + r]` is output (r, j).
        let mut by_column = vec![0f32; self.outputs * rows];
        by_column
            .par_chunks_mut(rows * COLUMNS_PER_TASK)
            .enumerate()
            .for_each(|(task, out)| {
                let first = task * COLUMNS_PER_TASK;
                for (c, column) in out.chunks_mut(rows).enumerate() {
                    let j = first + c;
                    let w = &weight[j * inputs..(j + 1) * inputs];
                    for (r, o) in column.iter_mut().enumerate() {
                        *o = dot(&x[r * inputs..(r + 1) * inputs], w) + self.bias_values[j];
                    }
                }
            });
        let mut out = vec![0f32; rows * self.outputs];
        for (j, column) in by_column.chunks_exact(rows).enumerate() {
            for (r, &v) in column.iter().enumerate() {
                out[r * self.outputs + j] = v;
            }
        }
        Tensor::from_vec(out, (rows, self.outputs), &Device::Cpu)
    }
}

/// The dot product of two equally long f32 slices: fused multiply-adds on 16 lanes where the
/// CPU has AVX2 and FMA (checked once), else the same loop for the baseline target.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked at run time).
        return unsafe { dot_fma(a, b) };
    }
    dot_lanes(a, b, |x, y, acc| x * y + acc)
}

#[inline(always)]
fn dot_lanes(a: &[f32], b: &[f32], madd: impl Fn(f32, f32, f32) -> f32) -> f32 {
    const LANES: usize = 16;
    let mut acc = [0f32; LANES];
    let (a_body, a_tail) = a.split_at(a.len() - a.len() % LANES);
    let (b_body, b_tail) = b.split_at(a_body.len().min(b.len()));
    for (x, y) in a_body.chunks_exact(LANES).zip(b_body.chunks_exact(LANES)) {
        for l in 0..LANES {
            acc[l] = madd(x[l], y[l], acc[l]);
        }
    }
    let mut sum = acc.iter().sum::<f32>();
    for (x, y) in a_tail.iter().zip(b_tail) {
        sum = madd(*x, *y, sum);
    }
    sum
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn dot_fma(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes(a, b, f32::mul_add)
}

#[cfg(target_arch = "x86_64")]
fn fma() -> bool {
    static FMA: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FMA.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    })
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
    token_types: Embedding,
    norm: LayerNorm,
}

impl Embeddings {
    fn load(vb: VarBuilder, c: &Config) -> Result<Embeddings> {
        Ok(Embeddings {
            words: embedding(c.vocab_size, c.hidden_size, vb.pp("word_embeddings"))?,
            positions: embedding(
                c.max_position_embeddings,
                c.hidden_size,
                vb.pp("position_embeddings"),
            )?,
            token_types: embedding(
                c.type_vocab_size,
                c.hidden_size,
                vb.pp("token_type_embeddings"),
            )?,
            norm: layer_norm(c.hidden_size, c.layer_norm_eps, vb.pp("LayerNorm"))?,
        })
    }

    fn forward(&self, ids: &Tensor, types: &Tensor) -> Result<Tensor> {
        let (_, len) = ids.dims2()?;
        let positions = Tensor::arange(0u32, len as u32, ids.device())?;
        let x = (self.words.forward(ids)? + self.token_types.forward(types)?)?
            .broadcast_add(&self.positions.forward(&positions)?)?;
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
    fn load(vb: VarBuilder, c: &Config) -> Result<Layer> {
        let h = c.hidden_size;
        let attention = vb.pp("attention");
        let activation = Activation::named(&c.hidden_act)
            .ok_or_else(|| candle_core::Error::Msg(format!("hidden_act {}", c.hidden_act)))?;
        Ok(Layer {
            query: Linear::load(h, h, attention.pp("self").pp("query"))?,
            key: Linear::load(h, h, attention.pp("self").pp("key"))?,
            value: Linear::load(h, h, attention.pp("self").pp("value"))?,
            attention_out: Linear::load(h, h, attention.pp("output").pp("dense"))?,
            attention_norm: layer_norm(
                h,
                c.layer_norm_eps,
                attention.pp("output").pp("LayerNorm"),
            )?,
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

    fn forward(&self, x: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let q = self.by_head(&self.query.forward(x)?)?;
        let k = self.by_head(&self.key.forward(x)?)?;
        let v = self.by_head(&self.value.forward(x)?)?;
        let scores = (q.matmul(&k.t()?)? / (self.head_size as f64).sqrt())?.broadcast_add(mask)?;
        let probabilities = candle_nn::ops::softmax_last_dim(&scores)?;
        let context = probabilities
            .matmul(&v)?
            .transpose(1, 2)?
            .contiguous()?
            .flatten_from(2)?;
        let attended = self
            .attention_norm
            .forward(&(self.attention_out.forward(&context)? + x)?)?;
        let inner = self
            .activation
            .forward(&self.intermediate.forward(&attended)?)?;
        self.output_norm
            .forward(&(self.output.forward(&inner)? + attended)?)
    }
}

/// BERT's embeddings and encoder layers (no pooler: sentence-transformers pools the last
/// hidden states itself).
pub(crate) struct Bert {
    embeddings: Embeddings,
    layers: Vec<Layer>,
}

impl Bert {
    /// Loads the weights `vb` holds (at its root or under `bert.`).
    pub(crate) fn load(vb: VarBuilder, c: &Config) -> Result<Bert> {
        if let Some(why) = c.unsupported() {
            candle_core::bail!("{why}");
        }
        let vb = if vb.contains_tensor("bert.embeddings.word_embeddings.weight") {
            vb.pp("bert")
        } else {
            vb
        };
        let encoder = vb.pp("encoder");
        Ok(Bert {
            embeddings: Embeddings::load(vb.pp("embeddings"), c)?,
            layers: (0..c.num_hidden_layers)
                .map(|i| Layer::load(encoder.pp(format!("layer.{i}")), c))
                .collect::<Result<_>>()?,
        })
    }

    /// The last hidden states, `(batch, len, hidden)`, of token ids `(batch, len)` with their
    /// token types and attention mask (1 for a real token, 0 for padding).
    pub(crate) fn forward(&self, ids: &Tensor, types: &Tensor, mask: &Tensor) -> Result<Tensor> {
        let mut x = self.embeddings.forward(ids, types)?;
        // Padding gets the lowest score before the softmax: (1 - mask) · f32::MIN, as
        // `transformers` extends the mask, broadcast over heads and query positions.
        let mask = mask.to_dtype(DType::F32)?;
        let mask = ((mask.ones_like()? - &mask)? * f64::from(f32::MIN))?
            .unsqueeze(1)?
            .unsqueeze(1)?;
        for layer in &self.layers {
            x = layer.forward(&x, &mask)?;
        }
        Ok(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_products_agree_with_the_plain_sum() {
        for len in [0usize, 1, 15, 16, 17, 384, 1536 + 3] {
            let a: Vec<f32> = (0..len)
                .map(|i| ((i * 7919) % 113) as f32 / 57.0 - 1.0)
                .collect();
            let b: Vec<f32> = (0..len)
                .map(|i| ((i * 104_729) % 97) as f32 / 48.0 - 1.0)
                .collect();
            let plain: f64 = a
                .iter()
                .zip(&b)
                .map(|(x, y)| f64::from(*x) * f64::from(*y))
                .sum();
            assert!(
                (f64::from(dot(&a, &b)) - plain).abs() < 1e-4,
                "length {len}"
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
