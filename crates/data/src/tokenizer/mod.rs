//! Hugging Face tokenizers: `tokenizer.json`, special tokens and chat templates ([`chat`],
//! whose `tojson` is Python's `json.dumps`, [`pyjson`]).
//!
//! Follows transformers 5's `TokenizersBackend` (`tokenization_utils_tokenizers.py`: special tokens
//! from `tokenizer_config.json`, missing ones added as special tokens; `tokenizer.json`'s
//! post-processor decides the special tokens of `tokenizer(text)`) and its chat templates
//! (`utils/chat_template_utils.py`, `_cached_compile_jinja_template` and `render_jinja_template`:
//! `trim_blocks` and `lstrip_blocks`, `raise_exception`, `strftime_now`, a `tojson` that is Python's
//! `json.dumps(ensure_ascii=False)`, the special tokens as template variables; the rendered text is
//! tokenised without special tokens, as `apply_chat_template(tokenize=True)` does).
//! The pad token falls back to the eos token as TRL's `DPOTrainer.__init__` does
//! (`trl/trainer/dpo_trainer.py`, `if self._tokenizer.pad_token is None`).

mod chat;
mod class;
mod pyjson;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokenizers::AddedToken;

use chat::{ChatTemplate, chat_template};

/// Errors from loading a tokenizer directory, encoding, decoding or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    /// A file could not be read.
    #[error("cannot read `{path}`")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `tokenizer.json` could not be parsed by the `tokenizers` crate.
    #[error("`{path}`: not a valid Hugging Face tokenizer")]
    Load {
        path: PathBuf,
        #[source]
        source: tokenizers::Error,
    },
    /// `tokenizer_config.json` or `special_tokens_map.json` is not valid JSON.
    #[error("`{path}`: invalid JSON")]
    ConfigJson {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    /// A field of `tokenizer_config.json` or `special_tokens_map.json` has the wrong type.
    #[error("`{path}`: field `{field}` {expected}")]
    ConfigField { path: PathBuf, field: String, expected: &'static str },
    /// No eos token is configured; DPO needs one (appended to completions, and the pad fallback).
    #[error("`{path}`: no `eos_token` is set")]
    NoEos { path: PathBuf },
    /// The tokenizer has no chat template, but conversational data needs one.
    #[error("`{path}`: no `chat_template` is set, so conversational data cannot be rendered")]
    NoChatTemplate { path: PathBuf },
    /// `chat_template` is a list of named templates without one named `default`.
    #[error("`{path}`: `chat_template` lists named templates but none is named `default`")]
    NoDefaultTemplate { path: PathBuf },
    /// The chat template does not compile.
    #[error("`{path}`: the chat template does not compile")]
    TemplateSyntax {
        path: PathBuf,
        #[source]
        source: minijinja::Error,
    },
    /// Rendering the chat template failed (this includes `raise_exception` calls).
    #[error("`{path}`: rendering the chat template failed")]
    TemplateRender {
        path: PathBuf,
        #[source]
        source: minijinja::Error,
    },
    /// `apply_chat_template` was called without messages (transformers refuses too).
    #[error("cannot apply the chat template to an empty conversation")]
    EmptyConversation,
    /// The `tokenizers` crate failed to encode a text.
    #[error("encoding failed")]
    Encode {
        #[source]
        source: tokenizers::Error,
    },
    /// The `tokenizers` crate failed to decode ids.
    #[error("decoding failed")]
    Decode {
        #[source]
        source: tokenizers::Error,
    },
}

/// One chat message, as in a conversational dataset (`{"role": .., "content": ..}`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// The message's content as the file has it: text, null (an assistant turn of `tool_calls`)
    /// or a list of content parts (`[{"type": "text", "text": ..}]`), handed to the chat
    /// template as transformers hands it.
    pub content: serde_json::Value,
    /// The message's other keys (`reasoning_content`, `tool_calls`, `name`, ...), which the chat
    /// template reads as transformers hands it the whole dict, in the file's order (serde_json
    /// and minijinja keep it, so `tojson` writes a nested object's keys as Python does).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl Message {
    /// The content's text: empty where the content is null or a list of parts.
    pub fn text(&self) -> &str {
        self.content.as_str().unwrap_or_default()
    }
}

/// What a conversational row passes to the chat template beside its messages, as TRL's
/// `DPOTrainer` does (`tools`, parsed where the column holds JSON text, and the row's
/// `chat_template_kwargs`, such as Qwen3's `enable_thinking`, which override the rest).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TemplateArgs {
    pub tools: Option<serde_json::Value>,
    pub kwargs: serde_json::Map<String, serde_json::Value>,
}

/// A Hugging Face tokenizer with its special tokens and chat template resolved.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The directory it was loaded from (named in errors).
    dir: PathBuf,
    eos_token: String,
    eos_id: u32,
    bos_token: Option<String>,
    bos_id: Option<u32>,
    pad_token: String,
    pad_id: u32,
    /// Other named special tokens (`unk_token`, ...), passed to the chat template like transformers'
    /// `special_tokens_map`.
    other_special: Vec<(String, String)>,
    chat_template: ChatTemplate,
    clean_up_tokenization_spaces: bool,
}

/// The keys of `tokenizer_config.json` that name special tokens, as in transformers'
/// `SPECIAL_TOKENS_ATTRIBUTES`.
const SPECIAL_TOKEN_KEYS: [&str; 7] =
    ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];

impl Tokenizer {
    /// Loads `dir/tokenizer.json`, plus `dir/tokenizer_config.json` (special tokens, chat template),
    /// the legacy `dir/special_tokens_map.json` (merged over the config when it has no
    /// `added_tokens_decoder`, as transformers does) and `dir/chat_template.jinja` (which takes
    /// precedence over the config's template, as in transformers 5) when present.
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizerError> {
        let tok_path = dir.join("tokenizer.json");
        let bytes =
            std::fs::read(&tok_path).map_err(|source| TokenizerError::Read { path: tok_path.clone(), source })?;
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg = if cfg_path.exists() { read_json_object(&cfg_path)? } else { serde_json::Map::new() };
        let mut inner = class::load(dir, &tok_path, &bytes, &cfg)?;

        // Legacy checkpoints: without `added_tokens_decoder` in the config, transformers merges
        // `special_tokens_map.json` over it (`PreTrainedTokenizerBase._from_pretrained`).
        let map_path = dir.join("special_tokens_map.json");
        let legacy_map = if !cfg.contains_key("added_tokens_decoder") && map_path.exists() {
            Some(read_json_object(&map_path)?)
        } else {
            None
        };

        // Named special tokens: strings or AddedToken objects `{"content": ..}`.
        let mut named: Vec<(String, String)> = Vec::new();
        for key in SPECIAL_TOKEN_KEYS {
            let content = match &legacy_map {
                Some(map) if map.contains_key(key) => special_token(map, key, &map_path)?,
                _ => special_token(&cfg, key, &cfg_path)?,
            };
            if let Some(content) = content {
                named.push((key.to_string(), content));
            }
        }
        // transformers adds configured special tokens missing from the vocabulary as special tokens.
        for (_, content) in &named {
            if inner.token_to_id(content).is_none() {
                inner.add_special_tokens(&[AddedToken::from(content.clone(), true)]);
            }
        }
        let lookup = |name: &str| named.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        let id_of = |inner: &tokenizers::Tokenizer, content: &str| {
            // Present: every named token was added above when missing.
            inner.token_to_id(content)
        };

        let Some(eos_token) = lookup("eos_token") else {
            return Err(TokenizerError::NoEos { path: if cfg_path.exists() { cfg_path } else { dir.to_path_buf() } });
        };
        let eos_id = id_of(&inner, &eos_token).ok_or_else(|| TokenizerError::NoEos { path: cfg_path.clone() })?;
        let bos_token = lookup("bos_token");
        let bos_id = bos_token.as_deref().and_then(|t| id_of(&inner, t));
        let pad_token = lookup("pad_token").unwrap_or_else(|| eos_token.clone());
        let pad_id = id_of(&inner, &pad_token).unwrap_or(eos_id);

        // `add_bos_token`/`add_eos_token` of the config are ignored: transformers 5 drops them when
        // `tokenizer.json` exists (`PreTrainedTokenizerBase._from_pretrained`), so the post-processor
        // of `tokenizer.json` alone decides which special tokens `tokenizer(text)` adds.

        let chat_template = chat_template(dir, &cfg, &cfg_path)?;
        let clean_up_tokenization_spaces =
            bool_field(&cfg, "clean_up_tokenization_spaces", &cfg_path)?.unwrap_or(false);
        let other_special =
            named.iter().filter(|(k, _)| k != "bos_token" && k != "eos_token" && k != "pad_token").cloned().collect();

        Ok(Self {
            inner,
            dir: dir.to_path_buf(),
            eos_token,
            eos_id,
            bos_token,
            bos_id,
            pad_token,
            pad_id,
            other_special,
            chat_template,
            clean_up_tokenization_spaces,
        })
    }

    /// Token ids of `text` without special tokens (`add_special_tokens=False`); added tokens such as
    /// `<|im_end|>` written in the text are still matched.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode_inner(text, false)
    }

    /// Token ids of `text` with the post-processor's special tokens (a Llama bos, for example), as
    /// `tokenizer(text)` gives them; TRL tokenises non-conversational text this way
    /// (`trl/data_utils.py`, `_tokenize`: `processing_class(text=input)`).
    pub fn encode_with_special_tokens(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.encode_inner(text, true)
    }

    fn encode_inner(&self, text: &str, special: bool) -> Result<Vec<u32>, TokenizerError> {
        let enc = self.inner.encode(text, special).map_err(|source| TokenizerError::Encode { source })?;
        Ok(enc.get_ids().to_vec())
    }

    /// The first ids of `text` when only `keep` of them are needed (keep_start truncation): at
    /// least `keep + 1` of them (so a caller sees that the text is longer), or all when fewer.
    ///
    /// A long text is encoded by prefixes: tokenisation is local (pre-tokenisers split on spaces
    /// and punctuation), so a cut far behind the kept ids cannot change them. A prefix is taken
    /// only once a prefix twice as long agrees on those ids; otherwise the whole text is encoded.
    /// One 20 MB row then costs a few thousand ids, not the tokenizer's working set for millions.
    pub fn encode_head(&self, text: &str, special: bool, keep: usize) -> Result<Vec<u32>, TokenizerError> {
        // Far more bytes than `keep` tokens take in any real vocabulary.
        let mut cut = keep.saturating_add(1).saturating_mul(32);
        while cut.saturating_mul(2) < text.len() {
            let head = self.encode_inner(&text[..text.floor_char_boundary(cut)], special)?;
            if head.len() > keep {
                let longer = self.encode_inner(&text[..text.floor_char_boundary(cut * 2)], special)?;
                if longer.len() > keep && head[..=keep] == longer[..=keep] {
                    return Ok(head[..=keep].to_vec());
                }
            }
            cut = cut.saturating_mul(4);
        }
        self.encode_inner(text, special)
    }

    /// [`Tokenizer::encode_chat`], of which only the first `keep` ids are needed (see
    /// [`Tokenizer::encode_head`]).
    pub fn encode_chat_head(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        args: Option<&TemplateArgs>,
        keep: usize,
    ) -> Result<Vec<u32>, TokenizerError> {
        let text = self.apply_chat_template_with(messages, add_generation_prompt, args)?;
        self.encode_head(&text, false, keep)
    }

    /// Text of `ids`; with `clean_up_tokenization_spaces` set in `tokenizer_config.json` the spaces
    /// before punctuation are removed as transformers does.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        let text = self.inner.decode(ids, skip_special_tokens).map_err(|source| TokenizerError::Decode { source })?;
        Ok(if self.clean_up_tokenization_spaces { clean_up_tokenization(&text) } else { text })
    }

    /// Renders `messages` with the chat template (`add_generation_prompt` appends the assistant
    /// header, for a prompt), like transformers' `apply_chat_template(tokenize=False)`.
    pub fn apply_chat_template(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        self.apply_chat_template_with(messages, add_generation_prompt, None)
    }

    /// [`Tokenizer::apply_chat_template`] with a row's `tools` and keyword arguments.
    pub fn apply_chat_template_with(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        args: Option<&TemplateArgs>,
    ) -> Result<String, TokenizerError> {
        let (path, source) = match &self.chat_template {
            ChatTemplate::Source { path, source } => (path, source),
            ChatTemplate::None => {
                return Err(TokenizerError::NoChatTemplate { path: self.dir.join("tokenizer_config.json") });
            }
            ChatTemplate::NoDefault => {
                return Err(TokenizerError::NoDefaultTemplate { path: self.dir.join("tokenizer_config.json") });
            }
        };
        if messages.is_empty() {
            return Err(TokenizerError::EmptyConversation);
        }
        let mut specials = vec![("eos_token", self.eos_token.as_str()), ("pad_token", self.pad_token.as_str())];
        if let Some(bos) = &self.bos_token {
            specials.push(("bos_token", bos));
        }
        specials.extend(self.other_special.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        chat::render(path, source, messages, add_generation_prompt, &specials, args)
    }

    /// Token ids of the rendered chat, without special tokens, as
    /// `apply_chat_template(messages, tokenize=True)` gives them.
    pub fn encode_chat(&self, messages: &[Message], add_generation_prompt: bool) -> Result<Vec<u32>, TokenizerError> {
        let text = self.apply_chat_template(messages, add_generation_prompt)?;
        self.encode(&text)
    }

    /// Whether a chat template is configured.
    pub fn has_chat_template(&self) -> bool {
        matches!(self.chat_template, ChatTemplate::Source { .. })
    }

    /// The eos token's text (TRL appends it to non-conversational completions).
    pub fn eos_token(&self) -> &str {
        &self.eos_token
    }

    /// The eos token id.
    pub fn eos_id(&self) -> u32 {
        self.eos_id
    }

    /// The bos token id, if the tokenizer has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    /// The pad token id: `pad_token`, or the eos token when none is set.
    pub fn pad_id(&self) -> u32 {
        self.pad_id
    }

    /// Vocabulary size including added tokens (largest id + 1).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab(true).values().max().map_or(0, |&m| m as usize + 1)
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// Reads a JSON file whose top level must be an object.
fn read_json_object(path: &Path) -> Result<serde_json::Map<String, serde_json::Value>, TokenizerError> {
    let text =
        std::fs::read_to_string(path).map_err(|source| TokenizerError::Read { path: path.to_path_buf(), source })?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|source| TokenizerError::ConfigJson { path: path.to_path_buf(), source })?;
    match value {
        serde_json::Value::Object(map) => Ok(map),
        _ => Err(TokenizerError::ConfigField {
            path: path.to_path_buf(),
            field: "(top level)".into(),
            expected: "must be a JSON object",
        }),
    }
}

/// Reads a special token given as a string or as an AddedToken object `{"content": ..}`.
fn special_token(
    cfg: &serde_json::Map<String, serde_json::Value>,
    key: &str,
    path: &Path,
) -> Result<Option<String>, TokenizerError> {
    match cfg.get(key) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(serde_json::Value::Object(obj)) => match obj.get("content") {
            Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(TokenizerError::ConfigField {
                path: path.to_path_buf(),
                field: format!("{key}.content"),
                expected: "must be a string",
            }),
        },
        Some(_) => Err(TokenizerError::ConfigField {
            path: path.to_path_buf(),
            field: key.to_string(),
            expected: "must be a string or an object with a `content` string",
        }),
    }
}

fn bool_field(
    cfg: &serde_json::Map<String, serde_json::Value>,
    key: &str,
    path: &Path,
) -> Result<Option<bool>, TokenizerError> {
    match cfg.get(key) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(TokenizerError::ConfigField {
            path: path.to_path_buf(),
            field: key.to_string(),
            expected: "must be true or false",
        }),
    }
}

/// transformers' `clean_up_tokenization`: removes spaces before punctuation and contractions.
fn clean_up_tokenization(text: &str) -> String {
    text.replace(" .", ".")
        .replace(" ?", "?")
        .replace(" !", "!")
        .replace(" ,", ",")
        .replace(" ' ", "'")
        .replace(" n't", "n't")
        .replace(" 'm", "'m")
        .replace(" 's", "'s")
        .replace(" 've", "'ve")
        .replace(" 're", "'re")
}

/// Test helpers shared with the data module's tests.
#[cfg(test)]
pub(crate) mod test_support {
    use std::path::Path;

    /// A scratch directory, removed when dropped (a test's files do not outlive it).
    pub struct ScratchDir(tempfile::TempDir);

    impl std::ops::Deref for ScratchDir {
        type Target = Path;

        fn deref(&self) -> &Path {
            self.0.path()
        }
    }

    /// A fresh, empty [`ScratchDir`] whose name starts with `prefix`.
    pub fn scratch_dir(prefix: &str) -> ScratchDir {
        ScratchDir(tempfile::Builder::new().prefix(prefix).tempdir().unwrap())
    }

    /// A tiny word-level tokenizer with ChatML tokens, written to a temporary directory.
    pub fn write_test_tokenizer(dir: &Path, config: &str) {
        let tokenizer_json = r#"{
          "version": "1.0",
          "truncation": null,
          "padding": null,
          "added_tokens": [
            {"id": 0, "content": "<unk>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 1, "content": "<|im_start|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true},
            {"id": 2, "content": "<|im_end|>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
          ],
          "normalizer": null,
          "pre_tokenizer": {"type": "WhitespaceSplit"},
          "post_processor": null,
          "decoder": null,
          "model": {"type": "WordLevel", "vocab": {"<unk>": 0, "<|im_start|>": 1, "<|im_end|>": 2,
             "hello": 3, "world": 4, "user": 5, "assistant": 6, "hi": 7, "blue": 8, "green": 9, "sky": 10,
             "the": 11, "is": 12, "system": 13}, "unk_token": "<unk>"}
        }"#;
        std::fs::create_dir_all(dir).unwrap();
        std::fs::write(dir.join("tokenizer.json"), tokenizer_json).unwrap();
        std::fs::write(dir.join("tokenizer_config.json"), config).unwrap();
    }

    pub const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
}

#[cfg(test)]
mod tests {
    use super::test_support::{CHATML, ScratchDir, scratch_dir, write_test_tokenizer};
    use super::*;

    fn temp_dir(name: &str) -> ScratchDir {
        scratch_dir(&format!("dpo-tok-{name}-"))
    }

    fn chatml_config() -> String {
        serde_json::json!({"eos_token": "<|im_end|>", "chat_template": CHATML}).to_string()
    }

    fn msgs(pairs: &[(&str, &str)]) -> Vec<Message> {
        pairs.iter().map(|(r, c)| Message { role: r.to_string(), content: (*c).into(), ..Message::default() }).collect()
    }

    #[test]
    fn special_tokens_and_pad_fallback() {
        let dir = temp_dir("special");
        write_test_tokenizer(&dir, &chatml_config());
        let tok = Tokenizer::from_dir(&dir).unwrap();
        assert_eq!(tok.eos_id(), 2);
        assert_eq!(tok.pad_id(), 2, "no pad token: pads with eos");
        assert_eq!(tok.bos_id(), None);
        assert_eq!(tok.vocab_size(), 14);
        assert_eq!(tok.encode("hello <|im_end|> world").unwrap(), vec![3, 2, 4]);
        assert_eq!(tok.decode(&[3, 2, 4], true).unwrap(), "hello world");
    }

    #[test]
    fn added_token_objects_and_post_processor() {
        let dir = temp_dir("objects");
        let cfg = serde_json::json!({
            "eos_token": {"content": "<|im_end|>", "__type": "AddedToken"},
            "bos_token": {"content": "<|im_start|>"},
            "pad_token": "<unk>",
            // Ignored by transformers 5 when tokenizer.json exists.
            "add_eos_token": true,
        });
        write_test_tokenizer(&dir, &cfg.to_string());
        // A Llama-style post-processor that prepends bos.
        let path = dir.join("tokenizer.json");
        let mut json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        json["post_processor"] = serde_json::json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}},
        });
        std::fs::write(&path, json.to_string()).unwrap();
        let tok = Tokenizer::from_dir(&dir).unwrap();
        assert_eq!(tok.bos_id(), Some(1));
        assert_eq!(tok.pad_id(), 0);
        assert_eq!(tok.encode("hello").unwrap(), vec![3]);
        assert_eq!(tok.encode_with_special_tokens("hello").unwrap(), vec![1, 3]);
    }

    #[test]
    fn legacy_special_tokens_map_overrides_config() {
        let dir = temp_dir("legacy");
        write_test_tokenizer(&dir, &serde_json::json!({"eos_token": "<unk>", "pad_token": "<unk>"}).to_string());
        std::fs::write(
            dir.join("special_tokens_map.json"),
            r#"{"eos_token": {"content": "<|im_end|>", "lstrip": false}, "pad_token": null}"#,
        )
        .unwrap();
        let tok = Tokenizer::from_dir(&dir).unwrap();
        assert_eq!((tok.eos_id(), tok.pad_id()), (2, 2));
        // With `added_tokens_decoder` the config is authoritative.
        write_test_tokenizer(&dir, &serde_json::json!({"eos_token": "<unk>", "added_tokens_decoder": {}}).to_string());
        let tok = Tokenizer::from_dir(&dir).unwrap();
        assert_eq!(tok.eos_id(), 0);
    }

    #[test]
    fn missing_special_token_is_added() {
        let dir = temp_dir("added");
        let cfg = serde_json::json!({"eos_token": "</s>"});
        write_test_tokenizer(&dir, &cfg.to_string());
        let tok = Tokenizer::from_dir(&dir).unwrap();
        assert_eq!(tok.eos_id(), 14);
        assert_eq!(tok.vocab_size(), 15);
    }

    #[test]
    fn chatml_render() {
        let dir = temp_dir("chatml");
        write_test_tokenizer(&dir, &chatml_config());
        let tok = Tokenizer::from_dir(&dir).unwrap();
        let m = msgs(&[("user", "hi")]);
        assert_eq!(
            tok.apply_chat_template(&m, true).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        assert_eq!(tok.apply_chat_template(&m, false).unwrap(), "<|im_start|>user\nhi<|im_end|>\n");
        assert!(matches!(tok.apply_chat_template(&[], false), Err(TokenizerError::EmptyConversation)));
    }

    #[test]
    fn template_list_uses_default_and_helpers_work() {
        let dir = temp_dir("list");
        let template = "{{ bos_token }}{% for m in messages %}{{ m.role.upper() }}={{ m | tojson }}{% endfor %}{% if messages|length > 5 %}{{ raise_exception('too long') }}{% endif %}";
        let cfg = serde_json::json!({
            "eos_token": "<|im_end|>",
            "bos_token": "<|im_start|>",
            "chat_template": [
                {"name": "tool_use", "template": "x"},
                {"name": "default", "template": template},
            ],
        });
        write_test_tokenizer(&dir, &cfg.to_string());
        let tok = Tokenizer::from_dir(&dir).unwrap();
        let m = msgs(&[("user", "a \"q\" <b> é")]);
        assert_eq!(
            tok.apply_chat_template(&m, false).unwrap(),
            "<|im_start|>USER={\"role\": \"user\", \"content\": \"a \\\"q\\\" <b> é\"}"
        );
        let many = msgs(&[("user", "x"); 6]);
        let err = tok.apply_chat_template(&many, false).unwrap_err();
        let source = std::error::Error::source(&err).unwrap().to_string();
        assert!(source.contains("too long"), "{source}");
    }

    #[test]
    fn trim_and_lstrip_blocks() {
        let dir = temp_dir("trim");
        let template =
            "{% for m in messages %}\n    {% if m.role == 'user' %}\nU:{{ m.content }}\n    {% endif %}\n{% endfor %}";
        let cfg = serde_json::json!({"eos_token": "<|im_end|>", "chat_template": template});
        write_test_tokenizer(&dir, &cfg.to_string());
        let tok = Tokenizer::from_dir(&dir).unwrap();
        let m = msgs(&[("user", "a"), ("user", "b")]);
        assert_eq!(tok.apply_chat_template(&m, false).unwrap(), "U:a\nU:b\n");
    }

    /// A message's keys besides `role` and `content` reach the template, as transformers hands it
    /// the whole dict: read by name, defined only where a message has them, and listed after
    /// `role` and `content` by `items()` and `tojson`.
    #[test]
    fn a_messages_other_keys_reach_the_template() {
        let dir = temp_dir("extra");
        let template = "{% for m in messages %}{{ m.role }}:{% if m.reasoning_content is defined %}<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}|{{ m | tojson }}\n{% endfor %}";
        let cfg = serde_json::json!({"eos_token": "<|im_end|>", "chat_template": template});
        write_test_tokenizer(&dir, &cfg.to_string());
        let tok = Tokenizer::from_dir(&dir).unwrap();
        let mut m = msgs(&[("user", "q"), ("assistant", "a")]);
        m[1].extra.insert("reasoning_content".into(), serde_json::json!("r"));
        assert_eq!(
            tok.apply_chat_template(&m, false).unwrap(),
            "user:q|{\"role\": \"user\", \"content\": \"q\"}\nassistant:<think>r</think>a|{\"role\": \"assistant\", \"content\": \"a\", \"reasoning_content\": \"r\"}\n"
        );
    }

    #[test]
    fn errors_name_the_file() {
        let dir = temp_dir("errors");
        let err = Tokenizer::from_dir(&dir).unwrap_err();
        assert_eq!(err.to_string(), format!("cannot read `{}`", dir.join("tokenizer.json").display()));
        write_test_tokenizer(&dir, "{\"eos_token\": 3}");
        let err = Tokenizer::from_dir(&dir).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "`{}`: field `eos_token` must be a string or an object with a `content` string",
                dir.join("tokenizer_config.json").display()
            )
        );
        write_test_tokenizer(&dir, "{}");
        let err = Tokenizer::from_dir(&dir).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("`{}`: no `eos_token` is set", dir.join("tokenizer_config.json").display())
        );
        write_test_tokenizer(&dir, "{\"eos_token\": \"<|im_end|>\"}");
        let tok = Tokenizer::from_dir(&dir).unwrap();
        let err = tok.apply_chat_template(&msgs(&[("user", "hi")]), false).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "`{}`: no `chat_template` is set, so conversational data cannot be rendered",
                dir.join("tokenizer_config.json").display()
            )
        );
    }
}
