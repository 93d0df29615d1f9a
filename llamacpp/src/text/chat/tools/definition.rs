//! The functions a conversation offers ([`Tool`]), whether and how the
//! model must call them ([`ToolChoice`]), checked together ([`Tools`]).

use serde_json::{Value, json};

use crate::error::{Error, Result};

/// At most this many tools per conversation.
pub const MAX_TOOLS: usize = 128;

/// One function the model may call.
#[derive(Clone, Debug, PartialEq)]
pub struct Tool {
    /// The name the model calls it by: 1 to 64 letters, digits, `_` or `-`.
    pub name: String,
    /// What it does, for the model.
    pub description: Option<String>,
    /// A JSON schema of its arguments (an object schema).
    pub parameters: Value,
}

impl Tool {
    /// A function with a description and a JSON schema of its arguments.
    pub fn new(name: impl Into<String>, description: impl Into<String>, parameters: Value) -> Tool {
        Tool { name: name.into(), description: Some(description.into()), parameters }
    }

    /// The tool as OpenAI's API and Hugging Face templates write it:
    /// `{"type": "function", "function": {"name", "description", "parameters"}}`.
    pub fn to_json(&self) -> Value {
        // In OpenAI's order (templates that write the tool out with
        // `tojson` keep it).
        let mut function = serde_json::Map::new();
        function.insert("name".into(), Value::String(self.name.clone()));
        if let Some(d) = &self.description {
            function.insert("description".into(), Value::String(d.clone()));
        }
        function.insert("parameters".into(), self.parameters.clone());
        json!({"type": "function", "function": function})
    }
}

/// Whether the model must call a tool.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model's output is text; calls are not parsed.
    None,
    /// The model may call tools; calls are parsed out of its output.
    #[default]
    Auto,
    /// The model must call one of the tools (forced by a constraint).
    Required,
    /// The model must call this tool.
    Named(String),
}

impl std::str::FromStr for ToolChoice {
    type Err = Error;

    /// `none`, `auto` or `required` (OpenAI's words; a named choice has no
    /// word).
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] (`tool_choice`) for any other word.
    fn from_str(s: &str) -> Result<ToolChoice> {
        match s {
            "none" => Ok(ToolChoice::None),
            "auto" => Ok(ToolChoice::Auto),
            "required" => Ok(ToolChoice::Required),
            other => {
                Err(invalid("tool_choice", format!("tool_choice {other:?} is not none, auto, required or a function")))
            }
        }
    }
}

/// The tools of a conversation, checked: names valid and unique, a named
/// choice among them.
#[derive(Clone, Debug, PartialEq)]
pub struct Tools {
    functions: Vec<Tool>,
    choice: ToolChoice,
    parallel: bool,
    /// The list as the template receives it.
    json: Vec<Value>,
}

fn invalid(name: &'static str, message: String) -> Error {
    Error::InvalidParameter { name, message }
}

impl Tools {
    /// `tools` with [`ToolChoice::Auto`] and parallel calls allowed.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] (`tools`): more than [`MAX_TOOLS`], a
    /// name that is not 1 to 64 letters, digits, `_` or `-`, a name used
    /// twice, parameters that are not a JSON object.
    pub fn new(tools: impl IntoIterator<Item = Tool>) -> Result<Tools> {
        let functions: Vec<Tool> = tools.into_iter().collect();
        let json = functions.iter().map(Tool::to_json).collect();
        Tools::checked(functions, json)
    }

    fn checked(functions: Vec<Tool>, json: Vec<Value>) -> Result<Tools> {
        if functions.len() > MAX_TOOLS {
            return Err(invalid("tools", format!("at most {MAX_TOOLS} tools")));
        }
        for (i, tool) in functions.iter().enumerate() {
            if !valid_name(&tool.name) {
                let name = &tool.name;
                return Err(invalid(
                    "tools",
                    format!("tools[{i}]: the name {name:?} must be 1 to 64 letters, digits, '_' or '-'"),
                ));
            }
            if functions[..i].iter().any(|t| t.name == tool.name) {
                return Err(invalid("tools", format!("tools[{i}]: the name {:?} is used twice", tool.name)));
            }
            if !tool.parameters.is_object() {
                return Err(invalid("tools", format!("tools[{i}]: parameters must be a JSON schema object")));
            }
        }
        Ok(Tools { functions, choice: ToolChoice::Auto, parallel: true, json })
    }

    /// Whether and which tool the model must call.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] (`tool_choice`): a named tool that is not
    /// among them, or a required call without tools.
    pub fn choice(mut self, choice: ToolChoice) -> Result<Tools> {
        if let ToolChoice::Named(name) = &choice
            && !self.functions.iter().any(|t| &t.name == name)
        {
            return Err(invalid("tool_choice", format!("tool_choice names {name:?}, which is not among the tools")));
        }
        if self.functions.is_empty() && matches!(choice, ToolChoice::Required | ToolChoice::Named(_)) {
            return Err(invalid("tool_choice", "tool_choice asks for a call, but there are no tools".to_owned()));
        }
        self.choice = choice;
        Ok(self)
    }

    /// Whether the model may make several calls in one turn (default
    /// true); without, only the first call is read.
    #[must_use]
    pub fn parallel(mut self, on: bool) -> Tools {
        self.parallel = on;
        self
    }

    /// OpenAI's `tools`, `tool_choice` and `parallel_tool_calls`, as a
    /// chat request sends them (`None` without tools): each tool is
    /// `{"type": "function", "function": {"name", "description"?,
    /// "parameters"?}}` and goes to the template as it is.
    ///
    /// # Errors
    /// [`Error::InvalidParameter`] naming the field (`tools`, `tool_choice`).
    pub fn from_openai(
        tools: Option<&[Value]>,
        tool_choice: Option<&Value>,
        parallel: Option<bool>,
    ) -> Result<Option<Tools>> {
        let raw = tools.unwrap_or_default();
        if raw.len() > MAX_TOOLS {
            return Err(invalid("tools", format!("at most {MAX_TOOLS} tools per request")));
        }
        let mut functions = Vec::with_capacity(raw.len());
        for (i, tool) in raw.iter().enumerate() {
            if tool.get("type").and_then(Value::as_str) != Some("function") {
                return Err(invalid("tools", format!("tools[{i}]: type must be \"function\"")));
            }
            let Some(function) = tool.get("function").filter(|f| f.is_object()) else {
                return Err(invalid("tools", format!("tools[{i}]: no function object")));
            };
            let parameters = match function.get("parameters") {
                None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
                Some(p) => p.clone(),
            };
            functions.push(Tool {
                name: function.get("name").and_then(Value::as_str).unwrap_or_default().to_owned(),
                description: function.get("description").and_then(Value::as_str).map(str::to_owned),
                parameters,
            });
        }
        let choice = match tool_choice {
            None | Some(Value::Null) => ToolChoice::Auto,
            Some(Value::String(s)) => s.parse()?,
            Some(object) => {
                let name = object
                    .get("function")
                    .and_then(|f| f.get("name"))
                    .and_then(Value::as_str)
                    .filter(|_| object.get("type").and_then(Value::as_str) == Some("function"));
                match name {
                    Some(name) => ToolChoice::Named(name.to_owned()),
                    None => {
                        return Err(invalid(
                            "tool_choice",
                            "tool_choice must be a string or {\"type\": \"function\", \"function\": {\"name\": …}}"
                                .to_owned(),
                        ));
                    }
                }
            }
        };
        let tools = Tools::checked(functions, raw.to_vec())?.choice(choice)?;
        Ok((!tools.functions.is_empty()).then_some(tools.parallel(parallel.unwrap_or(true))))
    }

    /// The functions, in order.
    pub fn functions(&self) -> &[Tool] {
        &self.functions
    }

    /// The choice ([`Tools::choice`]).
    pub fn tool_choice(&self) -> &ToolChoice {
        &self.choice
    }

    /// Whether several calls per turn are read.
    pub fn is_parallel(&self) -> bool {
        self.parallel
    }

    /// The tools as the chat template receives them (`tools`).
    pub fn to_json(&self) -> Value {
        Value::Array(self.json.clone())
    }

    /// Whether the output is read for calls (any choice but
    /// [`ToolChoice::None`]).
    pub fn parsed(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// Whether a constraint forces a call.
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

    fn refused(tools: &[Value], choice: Option<Value>) -> &'static str {
        match Tools::from_openai(Some(tools), choice.as_ref(), None) {
            Err(Error::InvalidParameter { name, .. }) => name,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tools_and_choices_are_checked() {
        let tools = [tool("get_weather"), tool("add")];
        let t = Tools::from_openai(Some(&tools), None, None).unwrap().unwrap();
        assert_eq!((t.tool_choice().clone(), t.is_parallel(), t.functions().len()), (ToolChoice::Auto, true, 2));
        let named = json!({"type": "function", "function": {"name": "add"}});
        let t = Tools::from_openai(Some(&tools), Some(&named), Some(false)).unwrap().unwrap();
        assert_eq!((t.tool_choice().clone(), t.is_parallel()), (ToolChoice::Named("add".into()), false));
        assert!(Tools::from_openai(None, None, None).unwrap().is_none());

        assert_eq!(refused(&[tool("bad name")], None), "tools");
        assert_eq!(refused(&[tool("a"), tool("a")], None), "tools");
        assert_eq!(refused(&[json!({"type": "retrieval"})], None), "tools");
        let params = json!({"type": "function", "function": {"name": "f", "parameters": 3}});
        assert_eq!(refused(&[params], None), "tools");
        let other = json!({"type": "function", "function": {"name": "missing"}});
        assert_eq!(refused(&tools, Some(other)), "tool_choice");
        assert_eq!(refused(&tools, Some(json!("sometimes"))), "tool_choice");
        assert_eq!(refused(&[], Some(json!("required"))), "tool_choice");
    }

    #[test]
    fn rust_tools_are_the_openai_shape() {
        let t = Tool::new("add", "Adds two numbers", json!({"type": "object"}));
        assert_eq!(
            t.to_json(),
            json!({"type": "function", "function": {"name": "add", "description": "Adds two numbers",
                   "parameters": {"type": "object"}}})
        );
        let tools = Tools::new([t.clone()]).unwrap();
        assert_eq!(tools.to_json(), json!([t.to_json()]));
        assert!(matches!(Tools::new([t.clone(), t]), Err(Error::InvalidParameter { name: "tools", .. })));
    }
}
