//! A chat request's `tools`, `tool_choice` and `parallel_tool_calls`,
//! checked.

use serde_json::{Value, json};

use crate::openai::ApiError;

/// At most this many tools per request.
pub const MAX_TOOLS: usize = 128;

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model's output is text; calls are not parsed.
    None,
    /// The model may call tools; calls are parsed out of its output.
    Auto,
    /// The model must call one of the tools (forced by a grammar).
    Required,
    /// The model must call this tool.
    Named(String),
}

/// The functions a request offers.
#[derive(Clone, Debug)]
pub struct Tools {
    /// `(name, parameters schema)`, in the request's order.
    pub functions: Vec<(String, Value)>,
    pub choice: ToolChoice,
    pub parallel: bool,
    /// The `tools` list as the template receives it.
    pub raw: Vec<Value>,
}

impl Tools {
    /// The request's tools (`None` without any), checked: each is
    /// `{"type": "function", "function": {"name", "parameters"?}}` with a
    /// name of letters, digits, `_` and `-` (at most 64, as OpenAI), names
    /// unique; `tool_choice` is `none`, `auto`, `required` or names one of
    /// them.
    ///
    /// # Errors
    /// A 400 naming the field.
    pub fn from_request(
        tools: Option<&[Value]>,
        tool_choice: Option<&Value>,
        parallel: Option<bool>,
    ) -> Result<Option<Tools>, ApiError> {
        let bad = |param: &'static str, why: String| ApiError::bad_request(why).param(param);
        let raw = tools.unwrap_or_default();
        if raw.len() > MAX_TOOLS {
            return Err(bad("tools", format!("at most {MAX_TOOLS} tools per request")));
        }
        let mut functions: Vec<(String, Value)> = Vec::with_capacity(raw.len());
        for (i, tool) in raw.iter().enumerate() {
            if tool.get("type").and_then(Value::as_str) != Some("function") {
                return Err(bad("tools", format!("tools[{i}]: type must be \"function\"")));
            }
            let function = tool.get("function").filter(|f| f.is_object());
            let Some(function) = function else {
                return Err(bad("tools", format!("tools[{i}]: no function object")));
            };
            let name = function.get("name").and_then(Value::as_str).unwrap_or_default();
            if !valid_name(name) {
                return Err(bad(
                    "tools",
                    format!("tools[{i}]: the name {name:?} must be 1 to 64 letters, digits, '_' or '-'"),
                ));
            }
            if functions.iter().any(|(n, _)| n == name) {
                return Err(bad("tools", format!("tools[{i}]: the name {name:?} is used twice")));
            }
            let parameters = match function.get("parameters") {
                None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
                Some(p @ Value::Object(_)) => p.clone(),
                Some(_) => return Err(bad("tools", format!("tools[{i}]: parameters must be a JSON schema object"))),
            };
            functions.push((name.to_owned(), parameters));
        }
        let choice = match tool_choice {
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) => match s.as_str() {
                "none" => ToolChoice::None,
                "auto" => ToolChoice::Auto,
                "required" => ToolChoice::Required,
                other => {
                    return Err(bad(
                        "tool_choice",
                        format!("tool_choice {other:?} is not none, auto, required or a function"),
                    ));
                }
            },
            Some(object) => {
                let name = object
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .filter(|_| object.get("type").and_then(Value::as_str) == Some("function"));
                match name {
                    Some(name) => ToolChoice::Named(name.to_owned()),
                    None => {
                        return Err(bad(
                            "tool_choice",
                            "tool_choice must be a string or {\"type\": \"function\", \"function\": {\"name\": …}}"
                                .to_owned(),
                        ));
                    }
                }
            }
        };
        if functions.is_empty() {
            return match choice {
                ToolChoice::Required | ToolChoice::Named(_) => {
                    Err(bad("tool_choice", "tool_choice asks for a call, but there are no tools".to_owned()))
                }
                _ => Ok(None),
            };
        }
        if let ToolChoice::Named(name) = &choice
            && !functions.iter().any(|(n, _)| n == name)
        {
            return Err(bad("tool_choice", format!("tool_choice names {name:?}, which is not among the tools")));
        }
        Ok(Some(Tools { functions, choice, parallel: parallel.unwrap_or(true), raw: raw.to_vec() }))
    }

    /// Whether the output is read for calls.
    pub fn parsed(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// Whether a grammar forces a call.
    pub fn forced(&self) -> bool {
        matches!(self.choice, ToolChoice::Required | ToolChoice::Named(_))
    }
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str) -> Value {
        json!({"type": "function", "function": {"name": name, "parameters": {"type": "object"}}})
    }

    #[test]
    fn tools_and_choices_are_checked() {
        let tools = [tool("get_weather"), tool("add")];
        let t = Tools::from_request(Some(&tools), None, None).unwrap().unwrap();
        assert_eq!((t.choice.clone(), t.parallel, t.functions.len()), (ToolChoice::Auto, true, 2));
        let named = json!({"type": "function", "function": {"name": "add"}});
        let t = Tools::from_request(Some(&tools), Some(&named), Some(false)).unwrap().unwrap();
        assert_eq!((t.choice, t.parallel), (ToolChoice::Named("add".into()), false));
        assert!(Tools::from_request(None, None, None).unwrap().is_none());

        let refused = |tools: &[Value], choice: Option<Value>| {
            Tools::from_request(Some(tools), choice.as_ref(), None).unwrap_err().param
        };
        assert_eq!(refused(&[tool("bad name")], None).as_deref(), Some("tools"));
        assert_eq!(refused(&[tool("a"), tool("a")], None).as_deref(), Some("tools"));
        assert_eq!(refused(&[json!({"type": "retrieval"})], None).as_deref(), Some("tools"));
        let other = json!({"type": "function", "function": {"name": "missing"}});
        assert_eq!(refused(&tools, Some(other)).as_deref(), Some("tool_choice"));
        assert_eq!(refused(&tools, Some(json!("sometimes"))).as_deref(), Some("tool_choice"));
        assert_eq!(refused(&[], Some(json!("required"))).as_deref(), Some("tool_choice"));
    }
}
