//! tch dtype helpers the model's graph nodes share.

/// `t` in `kind`: itself where it is already (torch's `to` would still be an operator call, and the
/// frozen reference's and the resident compute-dtype weights are already in the compute dtype).
pub fn as_kind(t: &tch::Tensor, kind: tch::Kind) -> tch::Tensor {
    if t.kind() == kind { t.shallow_clone() } else { t.to_kind(kind) }
}

/// The dtype a trained parameter's gradient comes back in from a graph node: f32 for a half-precision
/// parameter (the compute-dtype copy of an f32 master, whose gradients add up in f32), else the
/// parameter's own.
pub fn grad_kind(param: tch::Kind) -> tch::Kind {
    match param {
        tch::Kind::BFloat16 | tch::Kind::Half => tch::Kind::Float,
        kind => kind,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use tch::{Kind, Tensor};

    #[test]
    fn kinds() {
        let t = Tensor::from_slice(&[1.5f32]);
        assert_eq!(as_kind(&t, Kind::BFloat16).kind(), Kind::BFloat16);
        assert_eq!(as_kind(&t, Kind::Float).data_ptr(), t.data_ptr(), "no copy where the dtype holds");
        assert_eq!(grad_kind(Kind::BFloat16), Kind::Float);
        assert_eq!(grad_kind(Kind::Half), Kind::Float);
        assert_eq!(grad_kind(Kind::Double), Kind::Double);
    }
}
