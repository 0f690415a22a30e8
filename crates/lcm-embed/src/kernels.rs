//! The numeric loops the encoder runs itself where candle's are slow on the CPU: the product of
//! a linear layer with the few rows of a query ([`thin_product`]) and GELU with the exact error
//! function ([`gelu_erf`]). Each is a plain loop compiled twice, with AVX2 and fused
//! multiply-adds when the CPU has them (checked once, at run time) and for the baseline target
//! otherwise; the product's inner tile is written with AVX2's intrinsics on the first path,
//! where the compiler's vectorisation of the plain loop shuffled lanes instead.

use candle_core::backend::BackendStorage;
use candle_core::{CpuStorage, CustomOp1, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// Whether the CPU has AVX2 and FMA (checked once).
#[cfg(target_arch = "x86_64")]
fn fma() -> bool {
    static FMA: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *FMA.get_or_init(|| {
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
    })
}

/// Output columns one rayon task of [`thin_product`] computes.
const COLUMNS_PER_TASK: usize = 64;
/// Input rows and weight rows a tile of [`thin_product`] takes at once: each input value it
/// loads serves `TILE_COLUMNS` weight rows, each weight value `TILE_ROWS` input rows, and the
/// `TILE_ROWS × TILE_COLUMNS` sums of 8 lanes stay in registers (8 of AVX2's 16).
const TILE_ROWS: usize = 2;
const TILE_COLUMNS: usize = 4;
/// Inputs a tile sums over at once: the tile's weight rows (8 KB) stay in the L1 cache while
/// every input row passes them.
const TILE_DEPTH: usize = 512;
/// Lanes of the sums.
const LANES: usize = 8;

/// `x · Wᵀ + b` for few rows of `x` (`rows × inputs`, row-major) and a weight matrix `W`
/// (`outputs × inputs`, row-major, as checkpoints store it), on the current rayon pool; the
/// result is `rows × outputs`, row-major. A query's dozen word pieces make every linear layer
/// such a product. Taking each dot product alone read all input rows from the L2 cache once per
/// weight row, which bounded a query's embedding (not the memory: the weights are read once
/// either way); tiles of [`TILE_ROWS`] × [`TILE_COLUMNS`] dot products over [`TILE_DEPTH`]
/// inputs read them a quarter as often and keep their weights in L1.
pub(crate) fn thin_product(
    x: &[f32],
    rows: usize,
    weight: &[f32],
    bias: &[f32],
    inputs: usize,
    outputs: usize,
) -> Vec<f32> {
    assert_eq!(x.len(), rows * inputs, "input rows of {inputs} values");
    assert_eq!(
        weight.len(),
        outputs * inputs,
        "weight rows of {inputs} values"
    );
    assert_eq!(bias.len(), outputs, "a bias per output");
    // By column: `by_column[j * rows + r]` is output (r, j); each task owns whole columns.
    let mut by_column = vec![0f32; outputs * rows];
    if rows == 0 {
        return by_column;
    }
    by_column
        .par_chunks_mut(rows * COLUMNS_PER_TASK)
        .enumerate()
        .for_each(|(task, out)| {
            let first = task * COLUMNS_PER_TASK;
            let columns = out.len() / rows;
            let weights = &weight[first * inputs..(first + columns) * inputs];
            for (c, column) in out.chunks_exact_mut(rows).enumerate() {
                column.fill(bias[first + c]);
            }
            columns_product(x, rows, weights, inputs, out);
        });
    let mut out = vec![0f32; rows * outputs];
    for (j, column) in by_column.chunks_exact(rows).enumerate() {
        for (r, &v) in column.iter().enumerate() {
            out[r * outputs + j] = v;
        }
    }
    out
}

/// Adds `x · Wᵀ` of the weight rows `weights` into `out` (by column: `out[c * rows + r]`).
fn columns_product(x: &[f32], rows: usize, weights: &[f32], inputs: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked at run time).
        return unsafe { columns_product_fma(x, rows, weights, inputs, out) };
    }
    let madd = |a: f32, b: f32, acc: f32| a * b + acc;
    columns_product_with(x, rows, weights, inputs, out, |x, w| tile(x, w, madd), madd);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn columns_product_fma(x: &[f32], rows: usize, weights: &[f32], inputs: usize, out: &mut [f32]) {
    columns_product_with(
        x,
        rows,
        weights,
        inputs,
        out,
        |x, w| tile_fma(x, w),
        f32::mul_add,
    );
}

/// The loop over tiles: whole tiles by `full`, the edges (a row or columns left over) one dot
/// product at a time.
#[inline(always)]
fn columns_product_with(
    x: &[f32],
    rows: usize,
    weights: &[f32],
    inputs: usize,
    out: &mut [f32],
    full: impl Fn([&[f32]; TILE_ROWS], [&[f32]; TILE_COLUMNS]) -> [[f32; TILE_COLUMNS]; TILE_ROWS],
    madd: impl Fn(f32, f32, f32) -> f32 + Copy,
) {
    let columns = weights.len() / inputs;
    for c in (0..columns).step_by(TILE_COLUMNS) {
        let width = TILE_COLUMNS.min(columns - c);
        for k in (0..inputs).step_by(TILE_DEPTH) {
            let depth = TILE_DEPTH.min(inputs - k);
            let w_row = |j: usize| &weights[(c + j) * inputs + k..][..depth];
            for r in (0..rows).step_by(TILE_ROWS) {
                let height = TILE_ROWS.min(rows - r);
                let x_row = |i: usize| &x[(r + i) * inputs + k..][..depth];
                if (height, width) == (TILE_ROWS, TILE_COLUMNS) {
                    let sums = full(std::array::from_fn(x_row), std::array::from_fn(w_row));
                    for (i, row) in sums.iter().enumerate() {
                        for (j, sum) in row.iter().enumerate() {
                            out[(c + j) * rows + r + i] += sum;
                        }
                    }
                } else {
                    for i in 0..height {
                        for j in 0..width {
                            let [[sum]] = tile([x_row(i)], [w_row(j)], madd);
                            out[(c + j) * rows + r + i] += sum;
                        }
                    }
                }
            }
        }
    }
}

/// A whole tile with AVX2's fused multiply-adds, 8 lanes a register: the compiler's own
/// vectorisation of [`tile`] shuffled lanes across the tile's sums instead (measured slower
/// than one dot product at a time).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn tile_fma(x: [&[f32]; TILE_ROWS], w: [&[f32]; TILE_COLUMNS]) -> [[f32; TILE_COLUMNS]; TILE_ROWS] {
    use std::arch::x86_64::{__m256, _mm256_fmadd_ps, _mm256_loadu_ps, _mm256_setzero_ps};
    let len = x[0].len();
    assert!(x.iter().all(|s| s.len() == len) && w.iter().all(|s| s.len() == len));
    let body = len - len % LANES;
    let mut acc: [[__m256; TILE_COLUMNS]; TILE_ROWS] =
        [[_mm256_setzero_ps(); TILE_COLUMNS]; TILE_ROWS];
    for k in (0..body).step_by(LANES) {
        // SAFETY: `k + LANES <= body <= len`, the length of every row (asserted above).
        let xs: [__m256; TILE_ROWS] =
            std::array::from_fn(|i| unsafe { _mm256_loadu_ps(x[i].as_ptr().add(k)) });
        for j in 0..TILE_COLUMNS {
            // SAFETY: as above.
            let wj = unsafe { _mm256_loadu_ps(w[j].as_ptr().add(k)) };
            for i in 0..TILE_ROWS {
                acc[i][j] = _mm256_fmadd_ps(xs[i], wj, acc[i][j]);
            }
        }
    }
    std::array::from_fn(|i| {
        std::array::from_fn(|j| {
            // SAFETY: an `__m256` is eight f32 lanes.
            let lanes: [f32; LANES] = unsafe { std::mem::transmute(acc[i][j]) };
            let mut sum = lanes.iter().sum::<f32>();
            for (a, b) in x[i][body..].iter().zip(&w[j][body..]) {
                sum = a.mul_add(*b, sum);
            }
            sum
        })
    })
}

/// The `R × C` dot products of `R` input rows with `C` weight rows, all of one length.
#[inline(always)]
fn tile<const R: usize, const C: usize>(
    x: [&[f32]; R],
    w: [&[f32]; C],
    madd: impl Fn(f32, f32, f32) -> f32,
) -> [[f32; C]; R] {
    let len = x[0].len();
    let body = len - len % LANES;
    let mut acc = [[[0f32; LANES]; C]; R];
    let x_body: [&[f32]; R] = std::array::from_fn(|i| &x[i][..body]);
    let w_body: [&[f32]; C] = std::array::from_fn(|j| &w[j][..body]);
    for k in (0..body).step_by(LANES) {
        let xs: [&[f32; LANES]; R] =
            std::array::from_fn(|i| x_body[i][k..k + LANES].try_into().expect("lanes"));
        let ws: [&[f32; LANES]; C] =
            std::array::from_fn(|j| w_body[j][k..k + LANES].try_into().expect("lanes"));
        for i in 0..R {
            for j in 0..C {
                for l in 0..LANES {
                    acc[i][j][l] = madd(xs[i][l], ws[j][l], acc[i][j][l]);
                }
            }
        }
    }
    std::array::from_fn(|i| {
        std::array::from_fn(|j| {
            let mut sum = acc[i][j].iter().sum::<f32>();
            for (a, b) in x[i][body..].iter().zip(&w[j][body..]) {
                sum = madd(*a, *b, sum);
            }
            sum
        })
    })
}

/// GELU with the exact error function, `x · (1 + erf(x / √2)) / 2` (`transformers`' "gelu"),
/// on every thread of the current rayon pool and in SIMD lanes. candle's `gelu_erf` calls a
/// scalar `erf` for one element at a time on one thread: a sixth of a batch's time with
/// all-mpnet-base-v2 (docs/PERFORMANCE.md, "Embedding throughput").
pub(crate) fn gelu_erf(xs: &Tensor) -> Result<Tensor> {
    xs.contiguous()?.apply_op1_no_bwd(&GeluErf)
}

/// Elements one rayon task computes.
const GELU_CHUNK: usize = 16 * 1024;

struct GeluErf;

impl CustomOp1 for GeluErf {
    fn name(&self) -> &'static str {
        "lcm-gelu-erf"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(values) = storage else {
            candle_core::bail!("GELU takes f32 values, not {:?}", storage.dtype());
        };
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("GELU takes a contiguous tensor");
        };
        let input = &values[start..end];
        let mut out = vec![0f32; input.len()];
        out.par_chunks_mut(GELU_CHUNK)
            .zip(input.par_chunks(GELU_CHUNK))
            .for_each(|(out, input)| gelu_erf_slice(input, out));
        Ok((CpuStorage::F32(out), layout.shape().clone()))
    }
}

fn gelu_erf_slice(input: &[f32], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked at run time).
        return unsafe { gelu_erf_fma(input, out) };
    }
    gelu_erf_lanes(input, out, |x, y, acc| x * y + acc);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn gelu_erf_fma(input: &[f32], out: &mut [f32]) {
    gelu_erf_lanes(input, out, f32::mul_add);
}

#[inline(always)]
fn gelu_erf_lanes(input: &[f32], out: &mut [f32], madd: impl Fn(f32, f32, f32) -> f32) {
    for (o, &x) in out.iter_mut().zip(input) {
        let e = erf(x * std::f32::consts::FRAC_1_SQRT_2, &madd);
        *o = 0.5 * x * (1.0 + e);
    }
}

// The coefficients of the error function's approximation (below), as XLA and Eigen give them.
const ALPHA: [f64; 7] = [
    -2.726_142_258_013_06e-10,
    2.770_681_424_959_02e-8,
    -2.101_024_020_825_08e-6,
    -5.692_506_394_623_46e-5,
    -7.349_906_303_268_55e-4,
    -2.954_599_808_540_25e-3,
    -1.609_603_332_624_15e-2,
];
const BETA: [f64; 5] = [
    -1.456_607_184_649_96e-5,
    -2.133_740_552_789_05e-4,
    -1.682_826_974_382_03e-3,
    -7.373_329_167_204_68e-3,
    -1.426_473_905_141_89e-2,
];

/// The error function as the ratio of an odd polynomial of degree 13 to an even one of degree
/// 8 over `[-4, 4]` (beyond it `erf` is ±1 in f32), evaluated by Horner's rule: the
/// approximation XLA and Eigen use for f32, without branches so that it vectorises. Within
/// 5e-7 of the exact value everywhere (4.4e-7 at worst, tested); NaN stays NaN.
#[inline(always)]
fn erf(x: f32, madd: &impl Fn(f32, f32, f32) -> f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let x2 = x * x;
    let p = ALPHA[1..]
        .iter()
        .fold(ALPHA[0] as f32, |p, &a| madd(x2, p, a as f32));
    let q = BETA[1..]
        .iter()
        .fold(BETA[0] as f32, |q, &b| madd(x2, q, b as f32));
    x * p / q
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    /// `x · Wᵀ + b` summed in f64, row-major.
    fn plain_product(x: &[f32], weight: &[f32], bias: &[f32], inputs: usize) -> Vec<f64> {
        let outputs = bias.len();
        let mut out = Vec::new();
        for row in x.chunks_exact(inputs) {
            for (w, b) in weight.chunks_exact(inputs).zip(bias) {
                let dot: f64 = row
                    .iter()
                    .zip(w)
                    .map(|(a, b)| f64::from(*a) * f64::from(*b))
                    .sum();
                out.push(dot + f64::from(*b));
            }
        }
        assert_eq!(out.len(), x.len() / inputs * outputs);
        out
    }

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (((i + seed) * 2_654_435_761) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    #[test]
    fn thin_products_equal_the_plain_sums_at_every_edge() {
        // Rows odd and even, outputs not a multiple of a tile or a task, inputs not a multiple
        // of the lanes or of a tile's depth (and deeper than one tile).
        for (rows, inputs, outputs) in [
            (0, 16, 8),
            (1, 384, 384),
            (2, 7, 5),
            (3, 1029, 67),
            (12, 768, 130),
            (15, TILE_DEPTH * 2 + 9, COLUMNS_PER_TASK * 2 + 3),
        ] {
            let x = values(rows * inputs, rows);
            let weight = values(outputs * inputs, 1);
            let bias = values(outputs, 2);
            let ours = thin_product(&x, rows, &weight, &bias, inputs, outputs);
            let plain = plain_product(&x, &weight, &bias, inputs);
            assert_eq!(ours.len(), plain.len(), "{rows}×{inputs}×{outputs}");
            for (i, (a, b)) in ours.iter().zip(&plain).enumerate() {
                assert!(
                    (f64::from(*a) - b).abs() < 1e-3,
                    "{rows}×{inputs}×{outputs}, output {i}: {a} against {b}"
                );
            }
            // Real products, not zeros.
            assert!(rows == 0 || plain.iter().any(|v| v.abs() > 1.0));
        }
    }

    #[test]
    fn the_portable_tiles_equal_the_plain_sums() {
        // What a CPU without AVX2 and FMA computes (this one takes the other path above).
        let (rows, inputs, outputs) = (5, TILE_DEPTH + 11, 2 * TILE_COLUMNS + 1);
        let x = values(rows * inputs, 3);
        let weight = values(outputs * inputs, 4);
        let bias = vec![0f32; outputs];
        let madd = |a: f32, b: f32, acc: f32| a * b + acc;
        let mut by_column = vec![0f32; rows * outputs];
        columns_product_with(
            &x,
            rows,
            &weight,
            inputs,
            &mut by_column,
            |x, w| tile(x, w, madd),
            madd,
        );
        let plain = plain_product(&x, &weight, &bias, inputs);
        for r in 0..rows {
            for j in 0..outputs {
                let (a, b) = (by_column[j * rows + r], plain[r * outputs + j]);
                assert!(
                    (f64::from(a) - b).abs() < 1e-3,
                    "({r}, {j}): {a} against {b}"
                );
            }
        }
    }

    /// The exact GELU in f64, with candle's f64 error function as the reference.
    fn gelu_f64(x: f32) -> f64 {
        let x = f64::from(x);
        0.5 * x * (1.0 + candle_core::cpu::erf::erf_f64(x * std::f64::consts::FRAC_1_SQRT_2))
    }

    #[test]
    fn erf_is_within_a_few_ulps_of_the_exact_one() {
        let madd = |x: f32, y: f32, acc: f32| x * y + acc;
        let mut worst = 0f64;
        for i in -1_000_000..=1_000_000 {
            let x = i as f32 * 8e-6; // -8..8, finely
            let exact = candle_core::cpu::erf::erf_f64(f64::from(x));
            worst = worst.max((f64::from(erf(x, &madd)) - exact).abs());
        }
        assert!(worst < 5e-7, "largest difference {worst:e}");
        assert_eq!(erf(0.0, &madd), 0.0);
        assert_eq!(erf(30.0, &madd), 1.0);
        assert_eq!(erf(-30.0, &madd), -1.0);
    }

    #[test]
    fn gelu_equals_the_exact_one_on_every_path() {
        // Activations as a model's are: mostly small, some large, both signs; a length that is
        // not a multiple of the lanes or of a task's chunk.
        let n = 3 * GELU_CHUNK + 15;
        let values: Vec<f32> = (0..n)
            .map(|i| {
                let t = ((i * 2_654_435_761) % 100_003) as f32 / 100_003.0;
                (t - 0.5) * if i % 7 == 0 { 40.0 } else { 8.0 }
            })
            .collect();
        let xs = Tensor::from_vec(values.clone(), (3, n / 3), &Device::Cpu).unwrap();
        let ours: Vec<f32> = gelu_erf(&xs)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let mut plain = vec![0f32; n];
        gelu_erf_lanes(&values, &mut plain, |x, y, acc| x * y + acc);
        assert_eq!(ours.len(), n);
        for ((x, a), b) in values.iter().zip(&ours).zip(&plain) {
            let exact = gelu_f64(*x);
            let tolerance = 4e-7 * f64::from(x.abs()).max(1.0);
            assert!(
                (f64::from(*a) - exact).abs() < tolerance,
                "{x}: {a} against {exact}"
            );
            assert!(
                (f64::from(*b) - exact).abs() < tolerance,
                "{x}: {b} against {exact}"
            );
        }
        // A view that is not contiguous is computed as the values it shows.
        let matrix = Tensor::from_vec(values[..12].to_vec(), (3, 4), &Device::Cpu).unwrap();
        let transposed: Vec<f32> = gelu_erf(&matrix.t().unwrap())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let expected: Vec<f32> = matrix
            .t()
            .unwrap()
            .contiguous()
            .unwrap()
            .gelu_erf()
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        for (a, b) in transposed.iter().zip(&expected) {
            assert!((a - b).abs() < 1e-6, "{a} against {b}");
        }
    }

    #[test]
    fn gelu_refuses_what_is_not_f32() {
        let xs = Tensor::new(&[1.0f64, 2.0], &Device::Cpu).unwrap();
        let err = gelu_erf(&xs).unwrap_err().to_string();
        assert!(err.contains("f32"), "{err}");
    }
}
