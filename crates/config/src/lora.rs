//! LoRA settings (`lora_r`, `lora_alpha`, `lora_dropout`, `lora_target_modules`), checked once;
//! the adapters themselves live in `model::lora`.

/// The projections an adapter can attach to, by their HF module names.
pub const TARGET_MODULES: [&str; 7] = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"];

/// PEFT's default for the llama, mistral, qwen2 and qwen3 model types.
pub const DEFAULT_TARGET_MODULES: [&str; 2] = ["q_proj", "v_proj"];

/// The adapter's shape: rank, scaling, dropout and which projections carry one.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraSettings {
    pub r: usize,
    pub alpha: f64,
    /// The dropout the adapters apply while training: 0 under `disable_dropout` (TRL's
    /// `disable_dropout_in_model` sets every `nn.Dropout`, PEFT's `lora_dropout` included, to p=0).
    pub dropout: f64,
    /// `lora_dropout` as configured: what `adapter_config.json` records (PEFT saves its
    /// `LoraConfig`, which `disable_dropout` leaves alone).
    pub config_dropout: f64,
    /// Module names from [`TARGET_MODULES`], in that order: every projection some layer adapts.
    pub target_modules: Vec<String>,
    /// Single layers' modules (`model.layers.3.self_attn.q_proj`), where the targets name them
    /// rather than a projection of every layer: PEFT saves `all-linear` so. They alone decide for
    /// their projections; empty where every layer's are adapted.
    pub layer_modules: Vec<String>,
    /// rsLoRA scales by `α/√r` instead of `α/r` (Kalajdzievski 2023).
    pub use_rslora: bool,
    /// DoRA (Liu et al. 2024): a trained magnitude per output column of each adapted weight.
    pub use_dora: bool,
}

impl LoraSettings {
    /// Validated settings; `targets` may hold `all-linear` (every projection, as PEFT). An error
    /// names the config key at fault.
    pub fn new(r: usize, alpha: f64, dropout: f64, targets: &[String]) -> Result<Self, (&'static str, String)> {
        if r == 0 {
            return Err(("lora_r", "must be at least 1".to_owned()));
        }
        if !(alpha > 0.0 && alpha.is_finite()) {
            return Err(("lora_alpha", format!("must be > 0, got {alpha}")));
        }
        if !(0.0..1.0).contains(&dropout) {
            return Err(("lora_dropout", format!("must be in [0, 1), got {dropout}")));
        }
        let (target_modules, layer_modules) = resolve_targets(targets).map_err(|m| ("lora_target_modules", m))?;
        let (use_rslora, use_dora) = (false, false);
        Ok(Self { r, alpha, dropout, config_dropout: dropout, target_modules, layer_modules, use_rslora, use_dora })
    }

    /// Sets the configured `lora_dropout`; under `disable_dropout` (TRL's default) the adapters
    /// train without it, though `adapter_config.json` still records it, as PEFT's does.
    pub fn set_dropout(&mut self, configured: f64, disable_dropout: bool) {
        self.config_dropout = configured;
        self.dropout = if disable_dropout { 0.0 } else { configured };
    }

    /// The factor on `A·B`.
    pub fn scale(&self) -> f64 {
        if self.use_rslora { self.alpha / (self.r as f64).sqrt() } else { self.alpha / self.r as f64 }
    }

    /// The adapter's kind, as messages name it.
    pub fn kind(&self) -> &'static str {
        match (self.use_dora, self.use_rslora) {
            (true, true) => "DoRA (rsLoRA scaling)",
            (true, false) => "DoRA",
            (false, true) => "rsLoRA",
            (false, false) => "LoRA",
        }
    }

    /// Whether the projection `module` carries an adapter in some layer.
    pub fn targets(&self, module: &str) -> bool {
        self.target_modules.iter().any(|t| t == module)
    }

    /// Whether the module `key` (`model.layers.3.self_attn.q_proj`) carries an adapter.
    pub fn adapts(&self, key: &str) -> bool {
        let name = projection(key);
        let mut named = self.layer_modules.iter().filter(|m| projection(m) == name).peekable();
        self.targets(name) && (named.peek().is_none() || named.any(|m| m == key))
    }

    /// The projections adapted, for a run's opening line: `q_proj,k_proj (layers 0, 1)`.
    pub fn describe_targets(&self) -> String {
        let layers = |t: &str| -> Vec<&str> {
            let named = self.layer_modules.iter().filter(|m| projection(m) == t);
            named.filter_map(|m| m.split('.').nth(2)).collect()
        };
        let each = self.target_modules.iter().map(|t| match layers(t).as_slice() {
            [] => t.clone(),
            some => format!("{t} (layers {})", some.join(", ")),
        });
        each.collect::<Vec<_>>().join(",")
    }

    /// The targets as `target_modules` lists them for PEFT: the projections of every layer, then
    /// the single layers' modules.
    pub fn peft_targets(&self) -> Vec<String> {
        let layered = |t: &String| self.layer_modules.iter().any(|m| projection(m) == t);
        self.target_modules.iter().filter(|t| !layered(t)).chain(&self.layer_modules).cloned().collect()
    }
}

/// `all-linear`, or a list of [`TARGET_MODULES`] and modules as PEFT matches them (the module
/// whose name is the entry or ends in `.entry`: `mlp.down_proj`, `model.layers.3.self_attn.q_proj`)
/// → the projections adapted, deduplicated, in canonical order, and the single layers' modules
/// (full names, ascending) of the projections no entry adapts in every layer.
fn resolve_targets(targets: &[String]) -> Result<(Vec<String>, Vec<String>), String> {
    if targets.is_empty() {
        return Ok((DEFAULT_TARGET_MODULES.map(str::to_owned).to_vec(), Vec::new()));
    }
    if targets.iter().any(|t| t == "all-linear") {
        return Ok((TARGET_MODULES.map(str::to_owned).to_vec(), Vec::new()));
    }
    let mut entries = Vec::new();
    for t in targets {
        let unknown = || format!("unknown module `{t}`; use {} or all-linear", TARGET_MODULES.join(", "));
        entries.push(target_entry(t).ok_or_else(unknown)?);
    }
    let everywhere = |name: &str| entries.iter().any(|(n, layer)| *n == name && layer.is_none());
    let mut layers: Vec<(usize, usize)> = entries
        .iter()
        .filter(|(name, _)| !everywhere(name))
        .filter_map(|(name, layer)| Some((TARGET_MODULES.iter().position(|m| m == name)?, (*layer)?)))
        .collect();
    layers.sort_unstable();
    layers.dedup();
    let layer_modules =
        layers.iter().map(|&(m, i)| format!("model.layers.{i}.{}.{}", parent(m), TARGET_MODULES[m])).collect();
    let names = TARGET_MODULES.iter().filter(|m| entries.iter().any(|(n, _)| n == *m)).map(|m| (*m).to_owned());
    Ok((names.collect(), layer_modules))
}

/// A target entry that is a trailing part of a module's full name `model.layers.N.PARENT.NAME`:
/// the projection, and the layer where the entry names one.
fn target_entry(entry: &str) -> Option<(&'static str, Option<usize>)> {
    let mut parts = entry.rsplit('.');
    let last = parts.next()?;
    let name = TARGET_MODULES.iter().position(|m| *m == last)?;
    let rest: Vec<&str> = parts.collect();
    let layer = match rest.as_slice() {
        [] | [_] => None,
        [_, n, ..] => Some(n.parse::<usize>().ok()?),
    };
    let expected = [parent(name), "", "layers", "model"];
    let fits = rest.len() <= expected.len() && rest.iter().zip(expected).all(|(p, e)| e.is_empty() || *p == e);
    fits.then_some((TARGET_MODULES[name], layer))
}

/// The projection a module's full name ends in (`model.layers.3.self_attn.q_proj` → `q_proj`).
fn projection(module: &str) -> &str {
    module.rsplit('.').next().unwrap_or(module)
}

/// The submodule holding the projection at `index` of [`TARGET_MODULES`].
fn parent(index: usize) -> &'static str {
    if index < 4 { "self_attn" } else { "mlp" }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Entries as PEFT matches them: projection names, trailing parts of a module's name, and
    /// single layers' modules (as PEFT saves `all-linear`), which decide for their projection
    /// unless another entry names it in every layer.
    #[test]
    fn module_names_as_peft_matches_them() {
        let of = |t: &[&str]| LoraSettings::new(4, 8.0, 0.0, &t.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let s = of(&["model.layers.1.self_attn.k_proj", "model.layers.0.self_attn.k_proj", "mlp.down_proj", "q_proj"])
            .unwrap();
        assert_eq!(s.target_modules, ["q_proj", "k_proj", "down_proj"]);
        assert_eq!(s.layer_modules, ["model.layers.0.self_attn.k_proj", "model.layers.1.self_attn.k_proj"]);
        assert!(s.adapts("model.layers.7.self_attn.q_proj") && s.adapts("model.layers.7.mlp.down_proj"));
        assert!(s.adapts("model.layers.1.self_attn.k_proj") && !s.adapts("model.layers.2.self_attn.k_proj"));
        assert!(!s.adapts("model.layers.0.self_attn.v_proj"));
        assert_eq!(s.describe_targets(), "q_proj,k_proj (layers 0, 1),down_proj");
        assert_eq!(
            s.peft_targets(),
            ["q_proj", "down_proj", "model.layers.0.self_attn.k_proj", "model.layers.1.self_attn.k_proj"]
        );
        // A projection named in every layer too is adapted in every layer.
        let s = of(&["layers.3.mlp.up_proj", "up_proj"]).unwrap();
        assert!(s.layer_modules.is_empty() && s.adapts("model.layers.0.mlp.up_proj"));
        for bad in
            ["mlp.q_proj", "model.layers.x.mlp.up_proj", "base.model.layers.0.mlp.up_proj", "lm_head", "self_attn"]
        {
            let err = of(&[bad]).unwrap_err();
            assert_eq!(err.0, "lora_target_modules");
            assert!(err.1.starts_with(&format!("unknown module `{bad}`")), "{err:?}");
        }
    }

    #[test]
    fn disable_dropout_trains_without_dropout_but_records_it() {
        let mut s = LoraSettings::new(8, 16.0, 0.05, &[]).unwrap();
        assert_eq!((s.dropout, s.config_dropout), (0.05, 0.05));
        s.set_dropout(0.1, true);
        assert_eq!((s.dropout, s.config_dropout), (0.0, 0.1));
        s.set_dropout(0.1, false);
        assert_eq!((s.dropout, s.config_dropout), (0.1, 0.1));
    }
}
