//! The pipeline transformers 5 gives a tokenizer of a class with its own: `AutoTokenizer` picks
//! the class from `tokenizer_config.json` and the model's `config.json`
//! (`models/auto/tokenization_auto.py`), and a class such as `LlamaTokenizer` or
//! `Qwen2Tokenizer` takes only the vocabulary, merges and post-processor from `tokenizer.json`,
//! building its normaliser, pre-tokeniser, decoder and BPE options itself. A Llama-2 or TinyLlama
//! `tokenizer.json` (a "▁" Prepend + Replace normaliser) so tokenises under transformers without
//! the "▁" after a special token (Metaspace, `prepend_scheme = "first"`, unless `legacy`): what
//! TRL trains on, and so what this crate must produce.

use std::path::Path;

use serde_json::{Map, Value, json};

use super::TokenizerError;

/// `tokenizer.json` (`bytes`, read from `path`) loaded as transformers 5 loads the tokenizer in
/// `dir` whose `tokenizer_config.json` is `config`: with its class's pipeline where the class has
/// one, else as the file says.
pub(super) fn load(
    dir: &Path,
    path: &Path,
    bytes: &[u8],
    config: &Map<String, Value>,
) -> Result<tokenizers::Tokenizer, TokenizerError> {
    let load_error = |source| TokenizerError::Load { path: path.to_owned(), source };
    // The model's config beside the tokenizer, as `AutoConfig` reads it (none: no model type).
    let model = std::fs::read(dir.join("config.json"))
        .ok()
        .and_then(|text| serde_json::from_slice::<Map<String, Value>>(&text).ok())
        .unwrap_or_default();
    let declared = config.get("tokenizer_class").or_else(|| model.get("tokenizer_class")).and_then(Value::as_str);
    let model_type = model.get("model_type").and_then(Value::as_str);
    // transformers' own test: the text `"ByteLevel"` anywhere in the file.
    let byte_level = bytes.windows(11).any(|w| w == b"\"ByteLevel\"");
    // Only a class with a pipeline of its own needs the file parsed (tens of MB for a 150k vocabulary).
    if let Some(class) = resolve(declared, model_type, byte_level).filter(|c| OWN_PIPELINE.contains(c)) {
        let parsed: Value = serde_json::from_slice(bytes).map_err(|e| load_error(e.into()))?;
        if let Some(own) = rebuilt(class, &parsed, config) {
            let text = serde_json::to_vec(&own).map_err(|e| load_error(e.into()))?;
            return tokenizers::Tokenizer::from_bytes(&text).map_err(load_error);
        }
    }
    tokenizers::Tokenizer::from_bytes(bytes).map_err(load_error)
}

/// The classes whose pipeline [`rebuilt`] builds.
const OWN_PIPELINE: [&str; 2] = ["LlamaTokenizer", "Qwen2Tokenizer"];

/// Qwen2's split of text before byte-level BPE (`models/qwen2/tokenization_qwen2.py`).
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Model types whose tokenizer transformers takes from its own registry whatever the files
/// declare (`MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS`), among the families this project loads.
const REGISTRY_OVERRIDES: [&str; 1] = ["qwen2"];

/// Classes that read `tokenizer.json` as it is.
const GENERIC: [&str; 4] = ["TokenizersBackend", "PythonBackend", "PreTrainedTokenizerFast", "MistralCommonBackend"];

/// The tokenizer class transformers registers for a model type (`TOKENIZER_MAPPING_NAMES`), for
/// the families this project loads.
fn registered(model_type: &str) -> Option<&'static str> {
    match model_type {
        "qwen2" | "qwen3" => Some("Qwen2Tokenizer"),
        "mistral" => Some("TokenizersBackend"),
        _ => None,
    }
}

/// The class `AutoTokenizer` instantiates for a tokenizer declared `declared` (`tokenizer_class`,
/// without `Fast`) of a model of `model_type` whose `tokenizer.json` is or is not byte-level.
pub(super) fn resolve<'a>(declared: Option<&'a str>, model_type: Option<&str>, byte_level: bool) -> Option<&'a str> {
    let declared = declared.map(|c| c.strip_suffix("Fast").unwrap_or(c));
    let registry = model_type.and_then(registered);
    if declared == Some("LlamaTokenizer") && byte_level {
        return Some("TokenizersBackend");
    }
    match (declared, registry) {
        (Some(hub), Some(reg)) if hub != reg => {
            let overridden = model_type.is_some_and(|t| REGISTRY_OVERRIDES.contains(&t));
            match overridden && !GENERIC.contains(&reg) {
                true => Some(reg),
                false if GENERIC.contains(&reg) => Some("TokenizersBackend"),
                false => Some(hub),
            }
        }
        (Some(hub), _) => Some(hub),
        (None, reg) => reg,
    }
}

/// `tokenizer` (a parsed `tokenizer.json` with a BPE model) with the pipeline `class` builds,
/// `config` being `tokenizer_config.json`; `None` where the class takes the file as it is.
pub(super) fn rebuilt(class: &str, tokenizer: &Value, config: &Map<String, Value>) -> Option<Value> {
    if tokenizer.pointer("/model/type").and_then(Value::as_str) != Some("BPE") {
        return None;
    }
    let flag = |key: &str| config.get(key).and_then(Value::as_bool);
    let (normalizer, pre_tokenizer, decoder, model) = match class {
        "LlamaTokenizer" => {
            let prefix = flag("add_prefix_space").unwrap_or(true);
            // `_get_prepend_scheme`: "first" unless `legacy` (false by default in transformers 5).
            let scheme = match (prefix, flag("legacy").unwrap_or(false)) {
                (false, _) => "never",
                (true, true) => "always",
                (true, false) => "first",
            };
            let mut decoders = vec![
                json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "}),
                json!({"type": "ByteFallback"}),
                json!({"type": "Fuse"}),
            ];
            if prefix {
                decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
            }
            (
                Value::Null,
                json!({"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": false}),
                json!({"type": "Sequence", "decoders": decoders}),
                json!({"unk_token": null, "fuse_unk": true, "byte_fallback": true}),
            )
        }
        "Qwen2Tokenizer" => {
            let prefix = flag("add_prefix_space").unwrap_or(false);
            let split =
                json!({"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": false});
            let bytes =
                json!({"type": "ByteLevel", "add_prefix_space": prefix, "trim_offsets": true, "use_regex": false});
            (
                json!({"type": "NFC"}),
                json!({"type": "Sequence", "pretokenizers": [split, bytes]}),
                json!({"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}),
                json!({"unk_token": null, "fuse_unk": false, "byte_fallback": false, "continuing_subword_prefix": "", "end_of_word_suffix": ""}),
            )
        }
        _ => return None,
    };
    let mut out = tokenizer.clone();
    out["normalizer"] = normalizer;
    out["pre_tokenizer"] = pre_tokenizer;
    out["decoder"] = decoder;
    if let (Some(target), Value::Object(options)) = (out["model"].as_object_mut(), model) {
        target.extend(options);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::resolve;

    /// The classes transformers 5.23's `AutoTokenizer` picks for the declarations real models make.
    #[test]
    fn classes_as_auto_tokenizer_picks_them() {
        // Llama-2 / TinyLlama: their class; Llama-3: its file as it is; a byte-level file
        // labelled LlamaTokenizer: as it is.
        assert_eq!(resolve(Some("LlamaTokenizerFast"), Some("llama"), false), Some("LlamaTokenizer"));
        assert_eq!(resolve(Some("PreTrainedTokenizerFast"), Some("llama"), true), Some("PreTrainedTokenizer"));
        assert_eq!(resolve(Some("LlamaTokenizer"), Some("llama"), true), Some("TokenizersBackend"));
        // Mistral v0.1 declares LlamaTokenizer; transformers registers the generic backend.
        assert_eq!(resolve(Some("LlamaTokenizer"), Some("mistral"), false), Some("TokenizersBackend"));
        // qwen2 takes Qwen2Tokenizer whatever it declares; qwen3 keeps a generic declaration.
        assert_eq!(resolve(Some("TokenizersBackend"), Some("qwen2"), true), Some("Qwen2Tokenizer"));
        assert_eq!(resolve(Some("Qwen2TokenizerFast"), Some("qwen3"), true), Some("Qwen2Tokenizer"));
        assert_eq!(resolve(Some("TokenizersBackend"), Some("qwen3"), true), Some("TokenizersBackend"));
        // No declaration: the registry; no model type: the declaration.
        assert_eq!(resolve(None, Some("qwen3"), true), Some("Qwen2Tokenizer"));
        assert_eq!(resolve(Some("LlamaTokenizer"), None, false), Some("LlamaTokenizer"));
        assert_eq!(resolve(None, None, false), None);
    }
}
