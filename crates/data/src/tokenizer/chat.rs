//! Chat templates as transformers 5 renders them (`utils/chat_template_utils.py`,
//! `_cached_compile_jinja_template` and `render_jinja_template`): where the template comes from,
//! the Jinja environment (`trim_blocks`, `lstrip_blocks`, `raise_exception`, `strftime_now`,
//! Python's `json.dumps` as `tojson`), and the rendering context.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use minijinja::value::{Enumerator, Kwargs, Object, ObjectRepr, Value};
use minijinja::{Environment, ErrorKind};

use super::pyjson::{JsonOpts, dumps};
use super::{Message, TemplateArgs, TokenizerError};

/// Where the chat template came from and what it is.
#[derive(Debug, Clone)]
pub(super) enum ChatTemplate {
    None,
    NoDefault,
    Source { path: PathBuf, source: String },
}

/// `chat_template.jinja` if present, else `chat_template` of `tokenizer_config.json` (a string, or
/// a list of `{name, template}` from which `default` is used).
pub(super) fn chat_template(
    dir: &Path,
    cfg: &serde_json::Map<String, serde_json::Value>,
    cfg_path: &Path,
) -> Result<ChatTemplate, TokenizerError> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.exists() {
        let source =
            std::fs::read_to_string(&jinja).map_err(|source| TokenizerError::Read { path: jinja.clone(), source })?;
        return Ok(ChatTemplate::Source { path: jinja, source });
    }
    let bad = |expected| TokenizerError::ConfigField {
        path: cfg_path.to_path_buf(),
        field: "chat_template".into(),
        expected,
    };
    match cfg.get("chat_template") {
        None | Some(serde_json::Value::Null) => Ok(ChatTemplate::None),
        Some(serde_json::Value::String(s)) => {
            Ok(ChatTemplate::Source { path: cfg_path.to_path_buf(), source: s.clone() })
        }
        Some(serde_json::Value::Array(items)) => {
            for item in items {
                let name = item.get("name").and_then(|v| v.as_str());
                let template = item.get("template").and_then(|v| v.as_str());
                match (name, template) {
                    (Some("default"), Some(t)) => {
                        return Ok(ChatTemplate::Source { path: cfg_path.to_path_buf(), source: t.to_string() });
                    }
                    (Some(_), Some(_)) => {}
                    _ => {
                        return Err(bad("entries must be `{\"name\": .., \"template\": ..}` strings"));
                    }
                }
            }
            Ok(ChatTemplate::NoDefault)
        }
        Some(_) => Err(bad("must be a string or a list of `{name, template}` objects")),
    }
}

/// Renders `source` (from `path`, named in errors) over `messages`, with the special tokens as
/// template variables (transformers' `special_tokens_map`), then a row's `tools` and keyword
/// arguments (transformers' `{**special_tokens_map, **kwargs}`: a keyword overrides the rest).
pub(super) fn render(
    path: &Path,
    source: &str,
    messages: &[Message],
    add_generation_prompt: bool,
    specials: &[(&str, &str)],
    args: Option<&TemplateArgs>,
) -> Result<String, TokenizerError> {
    let env = template_env();
    let template = env
        .template_from_str(source)
        .map_err(|source| TokenizerError::TemplateSyntax { path: path.to_owned(), source })?;
    let messages: Vec<Value> = messages.iter().map(|m| Value::from_object(MessageValue(m.clone()))).collect();
    let tools = args.and_then(|a| a.tools.as_ref()).map_or(Value::from(()), Value::from_serialize);
    let mut ctx: Vec<(&str, Value)> = vec![
        ("messages", Value::from(messages)),
        ("add_generation_prompt", Value::from(add_generation_prompt)),
        ("tools", tools),
        ("documents", Value::from(())),
    ];
    ctx.extend(specials.iter().map(|(k, v)| (*k, Value::from(*v))));
    // Later entries win as the context is collected into a map.
    ctx.extend(args.into_iter().flat_map(|a| a.kwargs.iter().map(|(k, v)| (k.as_str(), Value::from_serialize(v)))));
    let ctx: Value = ctx.into_iter().collect();
    template.render(ctx).map_err(|source| TokenizerError::TemplateRender { path: path.to_owned(), source })
}

/// The Jinja environment transformers compiles chat templates in.
fn template_env() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |message: String| -> Result<Value, minijinja::Error> {
        Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
    });
    env.add_function("strftime_now", |format: String| {
        let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        dpo_base::clock::strftime(&format, secs)
    });
    env.add_filter("tojson", tojson);
    env
}

/// A message as the template sees it: a map whose keys iterate as `role`, `content`, then the
/// message's other keys (Python dict order for a message written role first), which `tojson`
/// and `items()` rely on.
#[derive(Debug)]
struct MessageValue(Message);

impl Object for MessageValue {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        match key.as_str()? {
            "role" => Some(Value::from(self.0.role.clone())),
            "content" => Some(Value::from_serialize(&self.0.content)),
            other => self.0.extra.get(other).map(Value::from_serialize),
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        let keys = ["role", "content"].into_iter().map(Value::from);
        Enumerator::Values(keys.chain(self.0.extra.keys().map(|k| Value::from(k.as_str()))).collect())
    }
}

/// transformers' `tojson` filter: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, without Jinja's HTML escaping.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<String, minijinja::Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match (v.as_i64(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(usize::try_from(n).unwrap_or(0))),
            (None, Some(s)) => Some(s.to_string()),
            _ => {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: `indent` must be an integer or a string",
                ));
            }
        },
    };
    // Python's defaults: (", ", ": ") without indent, (",", ": ") with one.
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([a, b]) => (a.clone(), b.clone()),
        Some(_) => {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                "tojson: `separators` must be a pair of strings",
            ));
        }
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let opts = JsonOpts {
        ensure_ascii: ensure_ascii.unwrap_or(false),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
    };
    dumps(value, &opts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tojson_options() {
        let env = template_env();
        let out = env
            .render_str(
                "{{ x | tojson(indent=2) }}|{{ y | tojson(sort_keys=true) }}|{{ 'é' | tojson(ensure_ascii=true) }}",
                minijinja::context! { x => vec![1, 2], y => minijinja::context!{ b => 1.5, a => true } },
            )
            .unwrap();
        assert_eq!(out, "[\n  1,\n  2\n]|{\"a\": true, \"b\": 1.5}|\"\\u00e9\"");
    }
}
