//! A model's Jinja chat template, compiled once with minijinja and rendered
//! the way Hugging Face transformers' `apply_chat_template` renders it.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::{Kwargs, Rest, Value, ValueKind};
use minijinja::{AutoEscape, Environment, ErrorKind, State, UndefinedBehavior};
use serde::Serialize;

use super::ChatMessage;
use super::python::{self, JsonStyle};
use crate::error::{Error, Result};

const NAME: &str = "chat_template";

/// A compiled chat template: parse once, render many times (it is `Send +
/// Sync`, so one template can serve every thread).
///
/// The environment matches transformers' (`ImmutableSandboxedEnvironment`
/// with `trim_blocks`, `lstrip_blocks` and `loopcontrols`): `raise_exception`,
/// `strftime_now` (UTC), `tojson` as Python's `json.dumps` with non-ASCII
/// kept, Python's string, dict and list methods (minijinja-contrib's
/// pycompat), values printed as Python prints them (`True`, `None`,
/// `{'a': 1}`), and the `{% generation %}` tag of assistant masks, which
/// renders its body.
///
/// ```
/// use llamacpp::chat::{ChatMessage, ChatTemplate, RenderOptions};
///
/// let template = ChatTemplate::new(
///     "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}\
///      {% if add_generation_prompt %}<|assistant|>{% endif %}",
/// )?;
/// let messages = [ChatMessage::system("Be brief."), ChatMessage::user("Hi!")];
/// let prompt = template.render(&messages, &RenderOptions::default().add_generation_prompt(true))?;
/// assert_eq!(prompt, "<|system|>Be brief.\n<|user|>Hi!\n<|assistant|>");
/// # Ok::<(), llamacpp::Error>(())
/// ```
#[derive(Clone)]
pub struct ChatTemplate {
    env: Arc<Environment<'static>>,
    /// The source as given, for the tool-call and reasoning syntaxes it
    /// teaches.
    source: Arc<str>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").finish_non_exhaustive()
    }
}

/// What a template is rendered with besides the messages: the variables
/// Hugging Face passes (`add_generation_prompt`, `tools`, `bos_token`,
/// `eos_token`) and any extra keyword variables (`enable_thinking`, …).
#[derive(Clone, Debug, Default)]
pub struct RenderOptions {
    pub(super) add_generation_prompt: bool,
    pub(super) tools: Option<serde_json::Value>,
    pub(super) bos_token: Option<String>,
    pub(super) eos_token: Option<String>,
    pub(super) vars: serde_json::Map<String, serde_json::Value>,
    now: Option<SystemTime>,
}

impl RenderOptions {
    setters! {
        /// End the prompt with the opening of an assistant turn.
        add_generation_prompt: bool => add_generation_prompt;
        /// The text of the BOS token (default: empty; a model's
        /// [`ChatFormat`](super::ChatFormat) fills it from the vocabulary).
        bos_token: impl Into<String> => bos_token (|v: _| Some(Into::into(v)));
        /// The text of the EOS token (default as for `bos_token`).
        eos_token: impl Into<String> => eos_token (|v: _| Some(Into::into(v)));
    }

    /// The tools the model may call, as a JSON list of OpenAI function
    /// specs (`[{"type": "function", "function": {"name", "description",
    /// "parameters"}}]`). Without it, `tools` is `None` in the template.
    #[must_use]
    pub fn tools(mut self, tools: serde_json::Value) -> Self {
        self.tools = Some(tools);
        self
    }

    /// An extra variable for the template, such as `enable_thinking` or
    /// `reasoning_effort`. It cannot replace `messages`: the messages are
    /// set last.
    #[must_use]
    pub fn var(mut self, name: impl Into<String>, value: serde_json::Value) -> Self {
        self.vars.insert(name.into(), value);
        self
    }

    /// The time `strftime_now` formats (default: the current time), for
    /// reproducible prompts.
    #[must_use]
    pub fn now(mut self, now: SystemTime) -> Self {
        self.now = Some(now);
        self
    }
}

/// The marker that tells a `raise_exception` error from any other failure.
#[derive(Debug)]
struct Raised;

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("raised by the template")
    }
}

impl std::error::Error for Raised {}

impl ChatTemplate {
    /// Compiles a Jinja chat template (a model's `tokenizer.chat_template`,
    /// or any template written for transformers).
    ///
    /// # Errors
    /// [`Error::ChatTemplate`] with minijinja's message and line if the
    /// template does not parse.
    pub fn new(source: &str) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(|out, _state, value| {
            let mut s = String::new();
            python::str_of(value, &mut s);
            out.write_str(&s).map_err(|e| minijinja::Error::new(ErrorKind::WriteFailure, e.to_string()))
        });
        env.add_filter("tojson", tojson);
        env.add_filter("string", |value: Value| {
            let mut s = String::new();
            python::str_of(&value, &mut s);
            s
        });
        // jinja2's `trim` is `str(value).strip(chars)`.
        env.add_filter("trim", |value: Value, chars: Option<String>| {
            let mut s = String::new();
            python::str_of(&value, &mut s);
            match chars {
                Some(chars) => s.trim_matches(|c| chars.contains(c)).to_owned(),
                None => s.trim().to_owned(),
            }
        });
        // jinja2's select/reject/map filters yield nothing for a false
        // value (so `none | selectattr(…)` is empty) and return generators:
        // one-shot, without a length, not JSON-serializable.
        env.add_filter("select", |state: &State, value: Value, test: Option<String>, args: Rest<Value>| {
            generator(value, |v| minijinja::filters::select(state, v, test.map(Into::into), args))
        });
        env.add_filter("reject", |state: &State, value: Value, test: Option<String>, args: Rest<Value>| {
            generator(value, |v| minijinja::filters::reject(state, v, test.map(Into::into), args))
        });
        env.add_filter(
            "selectattr",
            |state: &State, value: Value, attr: String, test: Option<String>, args: Rest<Value>| {
                generator(value, |v| minijinja::filters::selectattr(state, v, attr.into(), test.map(Into::into), args))
            },
        );
        env.add_filter(
            "rejectattr",
            |state: &State, value: Value, attr: String, test: Option<String>, args: Rest<Value>| {
                generator(value, |v| minijinja::filters::rejectattr(state, v, attr.into(), test.map(Into::into), args))
            },
        );
        env.add_filter("map", |state: &State, value: Value, args: Rest<Value>| {
            generator(value, |v| minijinja::filters::map(state, v, args))
        });
        // Python's notions: `None` is not iterable; strings, dicts and
        // undefined are sequences; bools are numbers.
        env.add_test("none", |v: &Value| v.is_none() || python::is_py_none(v));
        env.add_test("iterable", |v: &Value| {
            matches!(
                v.kind(),
                ValueKind::Seq | ValueKind::Map | ValueKind::String | ValueKind::Iterable | ValueKind::Undefined
            )
        });
        env.add_test("sequence", |v: &Value| {
            matches!(v.kind(), ValueKind::Seq | ValueKind::Map | ValueKind::String | ValueKind::Undefined)
        });
        env.add_test("number", |v: &Value| matches!(v.kind(), ValueKind::Number | ValueKind::Bool));
        env.add_function(
            "raise_exception",
            |message: Option<String>| -> std::result::Result<Value, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, message.unwrap_or_default()).with_source(Raised))
            },
        );
        env.add_function("strftime_now", |state: &State, format: String| {
            let now = state.lookup("__now").and_then(|v| v.as_i64()).unwrap_or(0);
            python::strftime(now, &format)
        });
        env.add_template_owned(NAME, rewrite_generation_tags(source)).map_err(|e| render_error(&e))?;
        Ok(ChatTemplate { env: Arc::new(env), source: source.into() })
    }

    /// The template's source, as given to [`ChatTemplate::new`].
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders `messages` with `options`.
    ///
    /// # Errors
    /// [`Error::ChatTemplateRaised`] when the template calls
    /// `raise_exception` (the conversation is one the model does not
    /// accept), [`Error::ChatTemplate`] for any other failure (an undefined
    /// attribute, a type error, …), with the template's message.
    pub fn render(&self, messages: &[ChatMessage], options: &RenderOptions) -> Result<String> {
        self.render_serialized(messages, options)
    }

    /// Renders messages given as JSON (a list of objects with `role`,
    /// `content`, …, passed to the template as they are), for callers that
    /// hold OpenAI-style JSON already.
    ///
    /// # Errors
    /// As [`render`](Self::render).
    pub fn render_json(&self, messages: &serde_json::Value, options: &RenderOptions) -> Result<String> {
        self.render_serialized(messages, options)
    }

    fn render_serialized<M: Serialize + ?Sized>(&self, messages: &M, options: &RenderOptions) -> Result<String> {
        let template = self.env.get_template(NAME).map_err(|e| render_error(&e))?;
        let now = options.now.unwrap_or_else(SystemTime::now);
        let now = match now.duration_since(UNIX_EPOCH) {
            Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
            Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
        };
        let mut vars: Vec<(String, Value)> =
            options.vars.iter().map(|(k, v)| (k.clone(), Value::from_serialize(v))).collect();
        vars.extend([
            ("bos_token".to_owned(), Value::from(options.bos_token.as_deref().unwrap_or_default())),
            ("eos_token".to_owned(), Value::from(options.eos_token.as_deref().unwrap_or_default())),
            ("add_generation_prompt".to_owned(), Value::from(options.add_generation_prompt)),
            ("tools".to_owned(), options.tools.as_ref().map_or_else(python::none, Value::from_serialize)),
            ("documents".to_owned(), python::none()),
            ("messages".to_owned(), Value::from_serialize(messages)),
            ("__now".to_owned(), Value::from(now)),
        ]);
        let ctx: Value = vars.into_iter().collect();
        template.render(ctx).map_err(|e| render_error(&e))
    }
}

/// A jinja2 generator filter: nothing for a false value, else `filter`'s
/// items as a Python generator.
fn generator(
    value: Value,
    filter: impl FnOnce(Value) -> std::result::Result<Vec<Value>, minijinja::Error>,
) -> std::result::Result<Value, minijinja::Error> {
    let items = if value.is_true() { filter(value)? } else { Vec::new() };
    Ok(python::generator(items))
}

/// transformers' `tojson`: `json.dumps(x, ensure_ascii=False, indent=None,
/// separators=None, sort_keys=False)`.
fn tojson(value: Value, args: Rest<Value>, kwargs: Kwargs) -> std::result::Result<String, minijinja::Error> {
    let mut style = JsonStyle::default();
    let indent: Option<Value> = kwargs.get("indent")?;
    let indent = indent.or_else(|| args.first().cloned());
    if let Some(indent) = indent.filter(|v| !v.is_none() && !v.is_undefined()) {
        style.indent = Some(match indent.as_str() {
            Some(s) => s.to_owned(),
            None => " ".repeat(usize::try_from(indent.as_i64().unwrap_or(0)).unwrap_or(0)),
        });
        style.item_separator = ",".into();
    }
    let separators: Option<Value> = kwargs.get("separators")?;
    if let Some(seps) = separators.filter(|v| !v.is_none()) {
        let item = seps.get_item(&Value::from(0))?;
        let key = seps.get_item(&Value::from(1))?;
        style.item_separator = item.as_str().unwrap_or(",").to_owned();
        style.key_separator = key.as_str().unwrap_or(":").to_owned();
    }
    if let Some(sort) = kwargs.get::<Option<bool>>("sort_keys")? {
        style.sort_keys = sort;
    }
    if let Some(ascii) = kwargs.get::<Option<bool>>("ensure_ascii")? {
        style.ensure_ascii = ascii;
    }
    kwargs.assert_all_used()?;
    let mut out = String::new();
    python::json_dumps(&value, &style, &mut out)?;
    Ok(out)
}

/// transformers' `{% generation %}…{% endgeneration %}` (it marks assistant
/// text for training masks) renders its body: rewritten as `{% if true %}`
/// … `{% endif %}`, keeping the tags' whitespace control.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        // `{%}` is not a tag: the closing `%}` comes after the opening.
        let Some(end) = tag[2..].find("%}").map(|i| i + 2) else {
            break;
        };
        let inner = &tag[2..end];
        let body = inner.trim_start_matches(['-', '+']).trim_end_matches(['-', '+']).trim();
        let replacement = match body {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(r) => {
                let lead = &inner[..inner.len() - inner.trim_start_matches(['-', '+']).len()];
                let trail = &inner[inner.trim_end_matches(['-', '+']).len()..];
                out.push_str("{%");
                out.push_str(lead);
                out.push(' ');
                out.push_str(r);
                out.push(' ');
                out.push_str(trail);
                out.push_str("%}");
            }
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

fn render_error(e: &minijinja::Error) -> Error {
    let mut source: Option<&dyn std::error::Error> = Some(e);
    while let Some(err) = source {
        if err.is::<Raised>() {
            break;
        }
        source = err.source();
    }
    let raised = source.is_some();
    // The innermost minijinja error carries the template's own message.
    let mut inner = e;
    while let Some(next) = std::error::Error::source(inner).and_then(|s| s.downcast_ref::<minijinja::Error>()) {
        inner = next;
    }
    if raised {
        return Error::ChatTemplateRaised(inner.detail().unwrap_or_default().to_owned());
    }
    let line = e.line().map(|l| format!(" (line {l})")).unwrap_or_default();
    Error::ChatTemplate(format!("{e}{line}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_become_plain_blocks() {
        assert_eq!(
            rewrite_generation_tags("a{%- generation %}b{% endgeneration -%} c{% if x %}{% endif %}"),
            "a{%- if true %}b{% endif -%} c{% if x %}{% endif %}"
        );
        for odd in ["{%}", "{%", "x{%-%}y", "{%+ generation +%}{% endgeneration", "{%%}{%"] {
            let _ = rewrite_generation_tags(odd);
            assert!(ChatTemplate::new(odd).is_err() || odd.is_empty(), "{odd:?}");
        }
    }

    #[test]
    fn raise_exception_is_its_own_error() {
        let t = ChatTemplate::new("{{ raise_exception('no system role') }}").unwrap();
        match t.render(&[], &RenderOptions::default()) {
            Err(Error::ChatTemplateRaised(m)) => assert_eq!(m, "no system role"),
            other => panic!("{other:?}"),
        }
        let t = ChatTemplate::new("{{ messages[0].content.nope.deeper }}").unwrap();
        assert!(matches!(t.render(&[ChatMessage::user("x")], &RenderOptions::default()), Err(Error::ChatTemplate(_))));
        assert!(matches!(ChatTemplate::new("{% if %}"), Err(Error::ChatTemplate(_))));
    }

    #[test]
    fn python_printing_and_tojson() {
        let t = ChatTemplate::new(
            "{{ add_generation_prompt }} {{ tools }} {{ tools | tojson }} {{ x | tojson(indent=2) }}",
        )
        .unwrap();
        let opts =
            RenderOptions::default().tools(serde_json::json!([{"b": 1, "a": "é"}])).var("x", serde_json::json!([1]));
        assert_eq!(t.render(&[], &opts).unwrap(), "False [{'b': 1, 'a': 'é'}] [{\"b\": 1, \"a\": \"é\"}] [\n  1\n]");
    }

    #[test]
    fn strftime_now_uses_the_given_time() {
        let t = ChatTemplate::new("{{ strftime_now('%d %b %Y') }}").unwrap();
        let opts = RenderOptions::default().now(UNIX_EPOCH + std::time::Duration::from_secs(1_764_547_200));
        assert_eq!(t.render(&[], &opts).unwrap(), "01 Dec 2025");
    }
}
