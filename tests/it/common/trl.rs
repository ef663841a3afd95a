//! What the TRL parity tests share: a fixture case's keys applied as `train` applies them, and
//! TRL's gradients of one training batch compared with ours.

use std::collections::BTreeMap;

use dpo_train::config::TrainConfig;
use dpo_train::model::host;
use dpo_train::train::optim::GradAccumulator;
use serde::Deserialize;

use super::fixtures;

/// A generator's output: its cases, and the trainer's tokenised rows (of type `R`) per dataset
/// and `max_length`.
#[derive(Deserialize)]
pub struct Fixture<R> {
    pub cases: Vec<Case>,
    pub tokenized: BTreeMap<String, Vec<R>>,
}

impl<R: serde::de::DeserializeOwned> Fixture<R> {
    /// `tests/fixtures/expected/<name>`.
    pub fn read(name: &str) -> Self {
        let text = std::fs::read_to_string(fixtures().join("expected").join(name)).unwrap();
        serde_json::from_str(&text).unwrap()
    }
}

/// One case: TRL's `evaluate()` metrics on a dataset, and dpo-train's keys for it.
#[derive(Deserialize)]
pub struct Case {
    pub name: String,
    pub dataset: String,
    pub model: String,
    /// The reference model, where the case has one.
    #[serde(default)]
    pub ref_model: Option<String>,
    /// dpo-train's keys for the case.
    pub config: BTreeMap<String, serde_json::Value>,
    pub num_rows: usize,
    pub metrics: BTreeMap<String, f64>,
    /// TRL's loss and gradients of one training batch of every row.
    pub train_step: Option<TrainStep>,
}

impl Case {
    /// The case's keys as flags, validated.
    pub fn config(&self) -> TrainConfig {
        case_config(&self.name, &self.model, &self.dataset, &self.config)
    }
}

/// TRL's loss and gradients of one training batch of every row.
#[derive(Deserialize)]
pub struct TrainStep {
    pub loss: f64,
    pub grads: BTreeMap<String, GradStats>,
}

#[derive(Deserialize)]
pub struct GradStats {
    pub norm: f64,
    pub sum: f64,
}

/// A case's keys (`model` and `dataset` relative to `tests/fixtures`) as flags, validated.
pub fn case_config(name: &str, model: &str, dataset: &str, keys: &BTreeMap<String, serde_json::Value>) -> TrainConfig {
    let mut values = vec![
        ("model_name_or_path".to_owned(), fixtures().join(model).display().to_string()),
        ("train_file".to_owned(), fixtures().join(dataset).display().to_string()),
    ];
    values.extend(keys.iter().map(|(k, v)| (k.clone(), v.as_str().map_or_else(|| v.to_string(), str::to_owned))));
    let cfg = TrainConfig::default().with_overrides(&values).unwrap_or_else(|e| panic!("{name}: {e}"));
    cfg.resolve().unwrap_or_else(|e| panic!("{name}: {e}"));
    cfg
}

/// Every parameter's gradient norm and sum against TRL's, each within `relative` times TRL's
/// whole gradient norm (scaled by √n for a norm and n for a sum of n entries); the same names.
pub fn assert_gradients(what: &str, grads: &GradAccumulator, want: &TrainStep, relative: f64) {
    let scale = relative * want.grads.values().map(|g| g.norm * g.norm).sum::<f64>().sqrt();
    assert_eq!(grads.grads.keys().collect::<Vec<_>>(), want.grads.keys().collect::<Vec<_>>(), "{what}");
    for (name, trl) in &want.grads {
        let g: Vec<f64> = host(&grads.grads[name]).into_iter().map(f64::from).collect();
        let (norm, sum) = (g.iter().map(|x| x * x).sum::<f64>().sqrt(), g.iter().sum::<f64>());
        let n = g.len() as f64;
        assert!((norm - trl.norm).abs() <= scale * n.sqrt(), "{what} {name}: gradient norm {norm}, TRL {}", trl.norm);
        assert!((sum - trl.sum).abs() <= scale * n, "{what} {name}: gradient sum {sum}, TRL {}", trl.sum);
    }
}
