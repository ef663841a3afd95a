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
    /// Whether the parameter trains (a frozen LoRA base does not).
    pub trains: bool,
    /// Its gradient, flattened, when [`visit`] was given gradients holding one.
    pub grad: Option<Tensor<1>>,
    device: Device,
    /// [`ParamView::flat`]'s reshape, made only where a walk reads the values: the gradient sum
    /// after every backward reads none, and a reshape a parameter is a torch call a step each.
    values: Box<dyn Fn() -> Tensor<1>>,
}

impl ParamView {
    pub fn device(&self) -> Device {
        self.device.clone()
    }

    /// Elements, `N`.
    pub fn numel(&self) -> usize {
        self.dims.iter().product()
    }

    /// The values flattened, `[N]` (still on the autodiff graph when the model is).
    pub fn flat(&self) -> Tensor<1> {
        (self.values)()
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
pub fn replace<M: Module>(model: M, mut f: impl FnMut(&str, &dyn Fn() -> Tensor<1>) -> Option<Tensor<1>>) -> M {
    model.map(&mut MapWalk { path: Vec::new(), how: Mapping::Replace(&mut f) })
}

/// Replaces the values of the parameters `keep` accepts with `f(name, values)`, `values` (`[N]`,
/// plain) handed over rather than shared: where the model held the only handle, an in-place kernel
/// can write into them without a copy (the optimizer's update). Ids stay, as in [`map`].
pub fn map_owned<M: Module>(
    model: M,
    keep: impl Fn(&str) -> bool,
    mut f: impl FnMut(&str, Tensor<1>) -> Tensor<1>,
) -> M {
    model.map(&mut MapWalk { path: Vec::new(), how: Mapping::Owned(&keep, &mut f) })
}

/// `t` as `[n]`: the same handle for a vector (norm weights, biases: a third of a model's
/// parameters), where a reshape is a torch call, three a parameter a step.
fn flat<const D: usize>(t: Tensor<D>, n: usize) -> Tensor<1> {
    match D {
        1 => Tensor::from_dispatch(t.into_dispatch()),
        _ => t.reshape([n]),
    }
}

/// [`flat`]'s inverse: `t` (`[N]`) in `shape`.
fn shaped<const D: usize>(t: Tensor<1>, shape: [usize; D]) -> Tensor<D> {
    match D {
        1 => Tensor::from_dispatch(t.into_dispatch()),
        _ => t.reshape(shape),
    }
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
        let grad = self.grads.and_then(|g| tensor.grad(g)).map(|g| flat(g, n));
        let (trains, device) = (tensor.is_require_grad(), tensor.device());
        let values = Box::new(move || flat(tensor.clone(), n));
        (self.f)(ParamView { name, dims, trains, grad, device, values });
    }
}

/// [`replace`]'s closure: new values from the name and, if called, the old ones flattened.
type Replacer<'a> = dyn FnMut(&str, &dyn Fn() -> Tensor<1>) -> Option<Tensor<1>> + 'a;

/// Where [`MapWalk`] gets a parameter's new values.
enum Mapping<'a> {
    /// [`replace`]'s closure; the model keeps the old values for `None`.
    Replace(&'a mut Replacer<'a>),
    /// [`map_owned`]'s filter and closure.
    Owned(&'a dyn Fn(&str) -> bool, &'a mut dyn FnMut(&str, Tensor<1>) -> Tensor<1>),
}

struct MapWalk<'a> {
    path: Vec<String>,
    how: Mapping<'a>,
}

impl ModuleMapper for MapWalk<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_owned());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        let shape = tensor.dims();
        let n = shape.iter().product::<usize>();
        let (tracked, autodiff) = (tensor.is_require_grad(), tensor.is_autodiff());
        let name = self.path.join(".");
        let updated = match &mut self.how {
            Mapping::Replace(f) => match f(&name, &|| flat(tensor.clone().inner(), n)) {
                Some(updated) => updated,
                None => return Param::from_mapped_value(id, tensor, mapper),
            },
            Mapping::Owned(keep, _) if !keep(&name) => return Param::from_mapped_value(id, tensor, mapper),
            // Moved, not cloned: unless something else shares the parameter, the reshape is a
            // view on storage nothing else holds.
            Mapping::Owned(_, f) => f(&name, flat(tensor.inner(), n)), // [N]
        };
        let updated = shaped(updated, shape);
        let updated = if autodiff { Tensor::<D>::from_inner(updated) } else { updated };
        Param::from_mapped_value(id, if tracked { updated.require_grad() } else { updated }, mapper)
    }
}
