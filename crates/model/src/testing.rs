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
