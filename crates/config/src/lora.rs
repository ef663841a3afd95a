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
    /// Module names from [`TARGET_MODULES`], in that order.
    pub target_modules: Vec<String>,
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
        let target_modules = resolve_targets(targets).map_err(|m| ("lora_target_modules", m))?;
        Ok(Self { r, alpha, dropout, config_dropout: dropout, target_modules, use_rslora: false, use_dora: false })
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

    /// Whether the projection `module` carries an adapter.
    pub fn targets(&self, module: &str) -> bool {
        self.target_modules.iter().any(|t| t == module)
    }
}

/// `all-linear` or a list of [`TARGET_MODULES`] → the names, deduplicated, in canonical order.
fn resolve_targets(targets: &[String]) -> Result<Vec<String>, String> {
    if targets.is_empty() {
        return Ok(DEFAULT_TARGET_MODULES.map(str::to_owned).to_vec());
    }
    if targets.iter().any(|t| t == "all-linear") {
        return Ok(TARGET_MODULES.map(str::to_owned).to_vec());
    }
    if let Some(bad) = targets.iter().find(|t| !TARGET_MODULES.contains(&t.as_str())) {
        return Err(format!("unknown module `{bad}`; use {} or all-linear", TARGET_MODULES.join(", ")));
    }
    Ok(TARGET_MODULES.iter().filter(|m| targets.iter().any(|t| t == *m)).map(|m| (*m).to_owned()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

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
