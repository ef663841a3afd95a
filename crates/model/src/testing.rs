//! Helpers of this crate's tests.

use burn::tensor::{Device, FloatDType, Tensor, TensorData};

use crate::weights::{RandomInit, TensorSource};

/// Normal values of `mean` and `std` drawn from a generator seeded by `name`: the same on
/// every run, so a bound a test holds them to fails every time or never (torch's generator is
/// shared by the tests running beside it).
pub fn normal<const D: usize>(shape: [usize; D], (mean, std): (f32, f64), name: &str, device: &Device) -> Tensor<D> {
    let values = RandomInit { seed: 0, std }.values(name, &shape).expect("random values");
    Tensor::<D>::from_data(TensorData::new(values, shape), device) + mean
}

/// The largest difference of `a` from `b` over `b`'s largest magnitude, in f32: how far a
/// graph node is from the composite it replaces, in units of that tensor's scale.
pub fn max_rel<const D: usize>(a: Tensor<D>, b: Tensor<D>) -> f32 {
    let (a, b) = (a.cast(FloatDType::F32), b.cast(FloatDType::F32));
    let scale: f32 = b.clone().abs().max().into_scalar();
    let diff: f32 = (a - b).abs().max().into_scalar();
    diff / scale
}

/// A loss whose gradient with respect to `y` is a fixed random cotangent c (drawn by `name`):
/// Σ y·c, in f32. Two ways of computing y then get the same incoming gradient, so their
/// gradients differ only by their own round-off; a loss like Σ sin(y) turns y's round-off
/// (|y|·u, large where y is) into a gradient error of that absolute size, whatever the layers do.
pub fn against_cotangent<const D: usize>(y: Tensor<D>, name: &str) -> Tensor<1> {
    let c = normal(y.dims(), (0.0, 1.0), name, &y.device());
    (y.cast(FloatDType::F32) * c).sum()
}
