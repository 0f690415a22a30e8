//! Tool definitions, the [`Tool`] trait, the context a call runs in, and the [`ToolRegistry`]
//! that validates arguments against each tool's JSON Schema before calling it.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use async_trait::async_trait;

use super::delegation::Delegator;
use lcm_core::config::Config;
use lcm_core::ids::SessionId;
use lcm_search::SearchIndex;
use lcm_store::Store;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::error::ToolError;

/// What a model is told about a tool: its name, what it does and its parameters as a JSON
/// Schema (an object schema).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDefinition {
    /// The name the model calls the tool by (1-64 of `a-z A-Z 0-9 _ -`).
    pub name: String,
    /// What the tool does and when to use it, for the model.
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
}

impl ToolDefinition {
    /// A definition from its parts.
    pub fn new(name: impl Into<String>, description: impl Into<String>, parameters: Value) -> Self {
        ToolDefinition {
            name: name.into(),
            description: description.into(),
            parameters,
        }
    }

    /// The OpenAI function-calling shape:
    /// `{"type": "function", "function": {name, description, parameters}}`.
    pub fn to_openai(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            }
        })
    }

    /// The Anthropic Messages shape: `{name, description, input_schema}`.
    pub fn to_anthropic(&self) -> Value {
        json!({
            "name": self.name,
            "description": self.description,
            "input_schema": self.parameters,
        })
    }

    /// The definition in `format`.
    pub fn to_format(&self, format: ToolFormat) -> Value {
        match format {
            ToolFormat::OpenAi => self.to_openai(),
            ToolFormat::Anthropic => self.to_anthropic(),
        }
    }
}

/// The provider shape tool definitions are exported in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolFormat {
    /// OpenAI Chat Completions / Responses function tools.
    #[serde(rename = "openai")]
    OpenAi,
    /// Anthropic Messages tools.
    Anthropic,
}

impl FromStr for ToolFormat {
    type Err = String;

    /// `openai` or `anthropic` (any case).
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "openai" => Ok(ToolFormat::OpenAi),
            "anthropic" => Ok(ToolFormat::Anthropic),
            other => Err(format!(
                "unknown tool format `{other}`: expected openai or anthropic"
            )),
        }
    }
}

/// Who is calling a tool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Caller {
    /// The session the caller works in, if any (tools default to it).
    pub session: Option<SessionId>,
    /// A sub-agent (spawned by a Task / expansion), as opposed to the main agent.
    pub is_sub_agent: bool,
    /// Delegation depth: 0 for the main agent, 1 for its sub-agents, and so on.
    pub depth: u32,
    /// A sub-agent's own task prompt (the scope-reduction guard compares against it).
    pub task: Option<String>,
    /// The scope its delegator declared for a sub-agent (`delegated_scope`), if any.
    pub scope: Option<String>,
    /// A read-only agent: it may not write files, and a read-only exploration agent
    /// (expansion) may not spawn further sub-agents.
    pub read_only: bool,
    /// Set for agents working on an `agentic_map` item: the size in bytes of that map's input.
    /// Maps they start must run over strictly smaller inputs.
    pub map_input_limit: Option<u64>,
}

impl Caller {
    /// The main agent of `session`.
    pub fn main_agent(session: Option<SessionId>) -> Self {
        Caller {
            session,
            ..Caller::default()
        }
    }

    /// A sub-agent at delegation `depth` (at least 1) working in `session`.
    pub fn sub_agent(session: Option<SessionId>, depth: u32) -> Self {
        Caller {
            session,
            is_sub_agent: true,
            depth: depth.max(1),
            ..Caller::default()
        }
    }
}

/// Everything a tool call may use. Cheap to clone (shared handles).
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The immutable store (reads are blocking: run them off the async task).
    pub store: Arc<Store>,
    /// The search index; without it `lcm_grep` scans (regex only).
    pub index: Option<Arc<SearchIndex>>,
    /// The configuration (search limits, snippet size, tokenizer).
    pub config: Arc<Config>,
    /// Who is calling.
    pub caller: Caller,
    /// Runs sub-agents for `Task`, `Tasks` and `lcm_expand_query` (the runtime provides it;
    /// without one those tools say they need the runtime).
    pub delegator: Option<Arc<dyn Delegator>>,
}

impl ToolContext {
    /// A context from its parts.
    pub fn new(
        store: Arc<Store>,
        index: Option<Arc<SearchIndex>>,
        config: Arc<Config>,
        caller: Caller,
    ) -> Self {
        ToolContext {
            store,
            index,
            config,
            caller,
            delegator: None,
        }
    }

    /// The same context with a delegator (sub-agents for `Task`, `Tasks`, `lcm_expand_query`).
    pub fn with_delegator(mut self, delegator: Arc<dyn Delegator>) -> Self {
        self.delegator = Some(delegator);
        self
    }

    /// The same context for another caller.
    pub fn with_caller(&self, caller: Caller) -> Self {
        ToolContext {
            caller,
            ..self.clone()
        }
    }
}

/// A tool a model can call: built-in ([`super::builtin_tools`]: `lcm_grep`, `lcm_describe`,
/// `lcm_pin`, ...) or provided by the host. Arguments reach [`Tool::call`] only after the
/// registry validated them against [`Tool::definition`]'s schema.
#[async_trait]
pub trait Tool: Send + Sync {
    /// Name, description and parameter schema. Called once, at registration.
    fn definition(&self) -> ToolDefinition;

    /// Whether the tool is listed for this caller by [`ToolRegistry::definitions_for`] (default:
    /// always). Calls are checked by the tool itself, whatever this says.
    fn offered_to(&self, caller: &Caller) -> bool {
        let _ = caller;
        true
    }

    /// Runs the tool. The result is what the model receives. Blocking work (store reads) must
    /// not run on the async task: use `tokio::task::spawn_blocking`.
    async fn call(&self, ctx: &ToolContext, args: Value) -> Result<Value, ToolError>;
}

struct Entry {
    tool: Arc<dyn Tool>,
    definition: ToolDefinition,
    /// Compiled once, at registration.
    validator: jsonschema::Validator,
}

/// The tools a model can call, by name, in registration order.
///
/// [`call`](ToolRegistry::call) validates the arguments against the tool's schema (compiled
/// once, when the tool is registered) and only then runs the tool, so a tool never sees
/// arguments its schema refuses.
#[derive(Default)]
pub struct ToolRegistry {
    entries: Vec<Entry>,
    by_name: HashMap<String, usize>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolRegistry")
            .field("tools", &self.names())
            .finish()
    }
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        ToolRegistry::default()
    }

    /// A registry with the built-in tools ([`super::builtin_tools`]): retrieval (`lcm_grep`,
    /// `lcm_describe`, `lcm_expand`, `lcm_read_file`, `lcm_expand_query`), delegation (`Task`,
    /// `Tasks`) and the agent's marks on its context (`lcm_pin`, `lcm_forget`).
    pub fn with_builtins() -> Self {
        let mut registry = ToolRegistry::new();
        for tool in super::builtin_tools() {
            // The built-in definitions are constants checked by the tests.
            if let Err(e) = registry.register(tool) {
                panic!("a built-in tool definition is invalid: {e}");
            }
        }
        registry
    }

    /// Adds a tool. Refused: a name already registered ([`ToolError::DuplicateTool`]), a name
    /// providers do not accept (1-64 of `a-z A-Z 0-9 _ -`), or a parameter schema that is not an
    /// object schema or does not compile ([`ToolError::InvalidDefinition`]).
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> Result<(), ToolError> {
        let definition = tool.definition();
        let name = definition.name.clone();
        let invalid = |reason: String| ToolError::InvalidDefinition {
            name: name.clone(),
            reason,
        };
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(invalid(
                "a tool name must be 1 to 64 characters of a-z, A-Z, 0-9, `_` or `-`".into(),
            ));
        }
        if self.by_name.contains_key(&name) {
            return Err(ToolError::DuplicateTool { name });
        }
        if definition.parameters.get("type") != Some(&Value::from("object")) {
            return Err(invalid(
                "the parameters must be a JSON Schema with \"type\": \"object\"".into(),
            ));
        }
        let validator = jsonschema::validator_for(&definition.parameters)
            .map_err(|e| invalid(format!("the parameter schema does not compile: {e}")))?;
        self.by_name.insert(name, self.entries.len());
        self.entries.push(Entry {
            tool,
            definition,
            validator,
        });
        Ok(())
    }

    /// The registered names, in registration order.
    pub fn names(&self) -> Vec<&str> {
        self.entries
            .iter()
            .map(|e| e.definition.name.as_str())
            .collect()
    }

    /// The tool registered as `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.by_name.get(name).map(|i| &self.entries[*i].tool)
    }

    /// Every definition, in registration order.
    pub fn definitions(&self) -> Vec<ToolDefinition> {
        self.entries.iter().map(|e| e.definition.clone()).collect()
    }

    /// The definitions offered to `caller` (the main agent is not offered `lcm_expand`).
    pub fn definitions_for(&self, caller: &Caller) -> Vec<ToolDefinition> {
        self.entries
            .iter()
            .filter(|e| e.tool.offered_to(caller))
            .map(|e| e.definition.clone())
            .collect()
    }

    /// Every definition in a provider's shape, as a JSON array.
    pub fn export(&self, format: ToolFormat) -> Value {
        Value::Array(
            self.entries
                .iter()
                .map(|e| e.definition.to_format(format))
                .collect(),
        )
    }

    /// The definitions offered to `caller` in a provider's shape, as a JSON array.
    pub fn export_for(&self, format: ToolFormat, caller: &Caller) -> Value {
        Value::Array(
            self.definitions_for(caller)
                .iter()
                .map(|d| d.to_format(format))
                .collect(),
        )
    }

    /// Checks `args` against the schema of tool `name`.
    pub fn validate(&self, name: &str, args: &Value) -> Result<(), ToolError> {
        let entry = self.entry(name)?;
        let errors: Vec<String> = entry
            .validator
            .iter_errors(args)
            .map(|e| {
                let pointer = e.instance_path().as_str();
                let at = if pointer.is_empty() {
                    "the arguments object".to_owned()
                } else {
                    pointer.to_owned()
                };
                format!("at {at}: {e}")
            })
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ToolError::InvalidArguments {
                tool: name.to_owned(),
                errors,
            })
        }
    }

    /// Validates `args` against tool `name`'s schema, then calls it. `null` arguments count as
    /// `{}` (some models send nothing for a call without parameters).
    pub async fn call(
        &self,
        ctx: &ToolContext,
        name: &str,
        args: Value,
    ) -> Result<Value, ToolError> {
        let args = if args.is_null() { json!({}) } else { args };
        self.validate(name, &args)?;
        let entry = self.entry(name)?;
        entry.tool.call(ctx, args).await
    }

    /// Like [`call`](Self::call), with the arguments as JSON text (the OpenAI wire shape). Text
    /// that is not JSON is [`ToolError::InvalidArguments`].
    pub async fn call_json(
        &self,
        ctx: &ToolContext,
        name: &str,
        arguments: &str,
    ) -> Result<Value, ToolError> {
        self.entry(name)?;
        let args = if arguments.trim().is_empty() {
            json!({})
        } else {
            serde_json::from_str(arguments).map_err(|e| {
                ToolError::invalid_argument(
                    name,
                    format!("at the arguments object: not valid JSON ({e})"),
                )
            })?
        };
        self.call(ctx, name, args).await
    }

    fn entry(&self, name: &str) -> Result<&Entry, ToolError> {
        self.by_name
            .get(name)
            .map(|i| &self.entries[*i])
            .ok_or_else(|| ToolError::UnknownTool {
                name: name.to_owned(),
                available: self.names().into_iter().map(str::to_owned).collect(),
            })
    }
}
