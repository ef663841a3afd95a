//! Matrix products of half-precision operands, fast on every CPU. Where the CPU has no units for
//! bf16 (fp16) matrices that oneDNN uses, torch multiplies them in its scalar reference gemm, about
//! 50x slower than its f32 one: a `[920, 128]·[128, 384]` bf16 product took 38 ms there, against
//! 0.8 ms for the same product of f32 copies (AMD EPYC, AVX2), and the demo's bf16 step spent 96% of
//! its time in such products. There the product runs on f32 copies and is rounded to the operands'
//! dtype: what the reference gemm computes too (f32 sums, one rounding), up to the order of the
//! f32 sums, so an element differs by at most one unit in the last place. Elsewhere (CUDA, a CPU
//! whose oneDNN has the units) it is torch's own. [`WIDEN_VAR`] decides instead: the operator
//! counts of `make bench` and their test set it to `0`, so a step's operators are a GPU's on
//! every CPU.

use std::sync::OnceLock;

use tch::{Kind, Tensor};

use crate::ffi;

/// `a·b`, in the operands' dtype.
///
/// # Shapes
/// - a: `[m, k]`, b: `[k, n]` → `[m, n]`
pub fn mm(a: &Tensor, b: &Tensor) -> Tensor {
    match widened(a) {
        Some(kind) => on_f32_copies(None, a, b, kind),
        None => a.mm(b),
    }
}

/// `bias + a·b` (`bias` broadcast to `[m, n]`), in the operands' dtype, rounded once.
///
/// # Shapes
/// - bias: `[n]`, `[m, 1]` or `[m, n]`; a: `[m, k]`, b: `[k, n]` → `[m, n]`
pub fn addmm(bias: &Tensor, a: &Tensor, b: &Tensor) -> Tensor {
    match widened(a) {
        Some(kind) => on_f32_copies(Some(bias), a, b, kind),
        None => bias.addmm(a, b),
    }
}

/// f32 elements of an operand's copy at a time (16 MiB): a block of `b`'s columns and then of
/// `a`'s rows, so that a product by a large weight (a 150k vocabulary's LM head) holds no f32
/// copy of all of it, nor of its output.
const BLOCK: i64 = 1 << 22;

/// `[bias +] a·b` computed block by block on f32 copies, each block's result rounded to `kind`
/// into its place in the output.
///
/// # Shapes
/// - bias: broadcast to `[m, n]`; a: `[m, k]`, b: `[k, n]` → `[m, n]`
fn on_f32_copies(bias: Option<&Tensor>, a: &Tensor, b: &Tensor, kind: Kind) -> Tensor {
    let (m, k, n) = (a.size()[0], a.size()[1], b.size()[1]);
    let out = Tensor::empty([m, n], (kind, a.device()));
    let bias = bias.map(|c| c.expand([m, n], false));
    let width = (BLOCK / k.max(1)).clamp(1, n.max(1));
    let height = (BLOCK / (k + width)).clamp(1, m.max(1));
    for j in (0..n).step_by(width as usize) {
        let w = width.min(n - j);
        let columns = b.narrow(1, j, w).to_kind(Kind::Float); // [k, w]
        for i in (0..m).step_by(height as usize) {
            let h = height.min(m - i);
            let rows = a.narrow(0, i, h).to_kind(Kind::Float); // [h, k]
            let part = match &bias {
                Some(c) => c.narrow(0, i, h).narrow(1, j, w).to_kind(Kind::Float).addmm(&rows, &columns),
                None => rows.mm(&columns),
            }; // [h, w]
            out.narrow(0, i, h).narrow(1, j, w).copy_(&part);
        }
    }
    out
}

/// The dtype to round to where a product of `a`'s dtype and device runs on f32 copies.
fn widened(a: &Tensor) -> Option<Kind> {
    widens(a.kind(), a.device()).then_some(a.kind())
}

/// The variable that runs half-precision CPU products on f32 copies (`1`) or by torch's own gemm
/// (`0`) whatever the CPU; `dpo-train` checks its value where a command starts.
pub const WIDEN_VAR: &str = "DPO_TRAIN_CPU_F32_PRODUCTS";

/// Whether products of operands of `kind` on `device` run on f32 copies, rounded to `kind`: on
/// the CPU, as [`WIDEN_VAR`] says, else where torch has only its reference gemm for `kind`.
pub fn widens(kind: Kind, device: tch::Device) -> bool {
    static SETTING: OnceLock<Option<bool>> = OnceLock::new();
    let half = match kind {
        Kind::BFloat16 => 0,
        Kind::Half => 1,
        _ => return false,
    };
    // A bad value reads as unset here: `dpo-train` refuses it where a command starts.
    let setting = *SETTING.get_or_init(|| dpo_base::env::switch(WIDEN_VAR).ok().flatten());
    device == tch::Device::Cpu && setting.unwrap_or_else(|| !cpu_gemm_native()[half])
}

/// Whether torch multiplies `[bf16, fp16]` matrices on this CPU with oneDNN (asked once: the
/// answer is the CPU's, capped by `ONEDNN_MAX_CPU_ISA`). Where torch cannot say (a build without
/// oneDNN), it has only the reference gemm.
pub fn cpu_gemm_native() -> [bool; 2] {
    static NATIVE: OnceLock<[bool; 2]> = OnceLock::new();
    *NATIVE.get_or_init(|| {
        [0, 1].map(|fp16| {
            let mut out = 0;
            // SAFETY: the shim writes the int it is given and catches every C++ exception.
            let code = unsafe { ffi::c10d_cpu_half_gemm_native(fp16, &mut out) };
            crate::check("cpu_half_gemm_native", code).is_ok() && out != 0
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Within one unit in the last place of torch's own half-precision product, on f32
    /// copies or not, for every layout the model's linear layers multiply in.
    #[test]
    fn products_round_as_torchs_own() {
        tch::manual_seed(3);
        for kind in [Kind::BFloat16, Kind::Half] {
            let a = Tensor::randn([37, 64], (kind, tch::Device::Cpu));
            let b = Tensor::randn([64, 24], (kind, tch::Device::Cpu));
            let bias = Tensor::randn([24], (kind, tch::Device::Cpu));
            assert_within_a_unit(&mm(&a, &b), &a.mm(&b));
            assert_within_a_unit(&mm(&b.tr(), &a.tr()), &b.tr().mm(&a.tr()));
            assert_within_a_unit(&addmm(&bias, &a, &b), &bias.addmm(&a, &b));
            let column = bias.unsqueeze(1);
            assert_within_a_unit(&addmm(&column, &b.tr(), &a.tr()), &column.addmm(&b.tr(), &a.tr()));
        }
    }

    /// A product larger than a block is computed block by block (three blocks of columns, each
    /// in three blocks of rows), the bias broadcast either way: the f32 product rounded once.
    #[test]
    fn blocks_make_the_whole_product() {
        tch::manual_seed(4);
        let kind = Kind::BFloat16;
        let (m, k, n) = (130, 64, (BLOCK / 64) * 2 + 5);
        let a = Tensor::randn([m, k], (kind, tch::Device::Cpu));
        let b = Tensor::randn([k, n], (kind, tch::Device::Cpu));
        let f32 = |t: &Tensor| t.to_kind(Kind::Float);
        assert_within_a_unit(&on_f32_copies(None, &a, &b, kind), &f32(&a).mm(&f32(&b)).to_kind(kind));
        for bias in [Tensor::randn([m, 1], (kind, tch::Device::Cpu)), Tensor::randn([n], (kind, tch::Device::Cpu))] {
            let whole = f32(&bias).addmm(&f32(&a), &f32(&b)).to_kind(kind);
            assert_within_a_unit(&on_f32_copies(Some(&bias), &a, &b, kind), &whole);
        }
    }

    /// `ours` has `expected`'s dtype and shape, each element within one unit in the last place
    /// of it (relative to the element, or to 1 below 1).
    fn assert_within_a_unit(ours: &Tensor, expected: &Tensor) {
        let kind = expected.kind();
        assert_eq!((ours.kind(), ours.size()), (kind, expected.size()));
        let ulp = if kind == Kind::BFloat16 { 1.0 / 128.0 } else { 1.0 / 1024.0 };
        let (ours, expected) = (ours.to_kind(Kind::Float), expected.to_kind(Kind::Float));
        let apart = (&ours - &expected).abs() / expected.abs().clamp_min(1.0);
        let worst = apart.max().double_value(&[]);
        assert!(worst <= ulp, "{kind:?}: {worst} apart, one unit is {ulp}");
    }

    /// f32 products are torch's own, to the bit.
    #[test]
    fn f32_products_are_torchs() {
        let a = Tensor::randn([5, 7], (Kind::Float, tch::Device::Cpu));
        let b = Tensor::randn([7, 3], (Kind::Float, tch::Device::Cpu));
        assert!(mm(&a, &b).equal(&a.mm(&b)));
        assert!(widened(&a).is_none());
    }
}
