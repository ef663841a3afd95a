//! Parameters by checkpoint name (`model.layers.0.mlp.up_proj.weight`): the one path-tracking walk
//! over a module that the exporter, the optimizer, the gradient sum and the all-reduce share.
//!
//! burn's visitors see a parameter as `Param<Tensor<D>>` for a const `D`; the walk hands each one
//! over flattened (`[N]`), with its name and shape, so one closure serves every rank.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::{Device, Gradients, Tensor};

/// One parameter as [`visit`] shows it.
pub struct ParamView {
    /// The checkpoint name.
    pub name: String,
    /// The shape in burn's layout (linear weights `[in, out]`).
    pub dims: Vec<usize>,
    /// The values flattened, `[N]` (still on the autodiff graph when the model is).
    pub flat: Tensor<1>,
    /// Whether the parameter trains (a frozen LoRA base does not).
    pub trains: bool,
    /// Its gradient, flattened, when [`visit`] was given gradients holding one.
    pub grad: Option<Tensor<1>>,
}

impl ParamView {
    pub fn device(&self) -> Device {
        self.flat.device()
    }
}

/// Calls `f` on every parameter of `model`, in module order; with `grads`, each view carries its
/// gradient.
pub fn visit<M: Module>(model: &M, grads: Option<&Gradients>, f: impl FnMut(ParamView)) {
    visit_where(model, grads, |_| true, f);
}

/// [`visit`] over the parameters whose names `keep` accepts; the others are not touched (ZeRO-3's
/// hollow parameters would be copied out by a flattening).
pub fn visit_where<M: Module>(
    model: &M,
    grads: Option<&Gradients>,
    keep: impl Fn(&str) -> bool,
    f: impl FnMut(ParamView),
) {
    model.visit(&mut Walk { path: Vec::new(), grads, keep, f });
}

/// Replaces the values of every parameter for which `f(name, values)` returns new ones (`[N]`,
/// plain tensors: an autodiff parameter gets its wrapper and `require_grad` back here); ids stay.
pub fn map<M: Module>(model: M, mut f: impl FnMut(&str, Tensor<1>) -> Option<Tensor<1>>) -> M {
    replace(model, |name, old| f(name, old()))
}

/// [`map`] where `f` flattens the old values only if it calls `old` (`[N]`, plain).
pub fn replace<M: Module>(model: M, f: impl FnMut(&str, &dyn Fn() -> Tensor<1>) -> Option<Tensor<1>>) -> M {
    model.map(&mut MapWalk { path: Vec::new(), f })
}

struct Walk<'a, K, F> {
    path: Vec<String>,
    grads: Option<&'a Gradients>,
    keep: K,
    f: F,
}

impl<K: Fn(&str) -> bool, F: FnMut(ParamView)> ModuleVisitor for Walk<'_, K, F> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_owned());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let name = self.path.join(".");
        if !(self.keep)(&name) {
            return;
        }
        let tensor = param.val();
        let dims = tensor.dims().to_vec();
        let n: usize = dims.iter().product();
        // The gradient is keyed by the parameter's own node, before any reshape.
        let grad = self.grads.and_then(|g| tensor.grad(g)).map(|g| g.reshape([n]));
        let trains = tensor.is_require_grad();
        (self.f)(ParamView { name, dims, flat: tensor.reshape([n]), trains, grad });
    }
}

struct MapWalk<F> {
    path: Vec<String>,
    f: F,
}

impl<F: FnMut(&str, &dyn Fn() -> Tensor<1>) -> Option<Tensor<1>>> ModuleMapper for MapWalk<F> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_owned());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        let shape = tensor.dims();
        let (tracked, autodiff) = (tensor.is_require_grad(), tensor.is_autodiff());
        let flat = || tensor.clone().inner().reshape([shape.iter().product::<usize>()]); // [N]
        let Some(updated) = (self.f)(&self.path.join("."), &flat) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let updated = updated.reshape(shape);
        let updated = if autodiff { Tensor::<D>::from_inner(updated) } else { updated };
        Param::from_mapped_value(id, if tracked { updated.require_grad() } else { updated }, mapper)
    }
}
