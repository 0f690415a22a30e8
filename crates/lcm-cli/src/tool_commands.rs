//! `lcm tool` (call one of the model's tools against the data directory) and `lcm tools` (print
//! their definitions in a provider's shape).

use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use lcm_engine::tools::{Caller, ToolContext, ToolFormat, ToolRegistry};

use crate::App;
use crate::commands::resolve_session;
use crate::output::print_json;

#[derive(Debug, Args)]
pub struct ToolArgs {
    /// The tool: lcm_grep, lcm_describe, lcm_expand, lcm_read_file, lcm_expand_query, Task,
    /// Tasks, lcm_pin or lcm_forget (`lcm tools` prints their definitions).
    pub name: String,
    /// The arguments, as a JSON object.
    #[arg(long, default_value = "{}")]
    pub args: String,
    /// The caller's session (`ses_N` or its key): tools default to it (lcm_grep searches it).
    #[arg(long)]
    pub session: Option<String>,
    /// Call as a sub-agent (needed for lcm_expand); the default caller is the main agent.
    #[arg(long)]
    pub sub_agent: bool,
}

#[derive(Debug, Clone, Copy, ValueEnum, PartialEq, Eq)]
pub enum DefinitionFormat {
    Openai,
    Anthropic,
}

#[derive(Debug, Args)]
pub struct ToolsArgs {
    /// Provider shape of the definitions.
    #[arg(long, value_enum, default_value = "openai")]
    pub format: DefinitionFormat,
    /// Only the tools offered to the main agent (without lcm_expand, which is for sub-agents).
    #[arg(long)]
    pub main_agent: bool,
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

/// `lcm tool <name> --args '<json>'`: prints the tool's result as JSON. A tool error is printed
/// as the model would see it and ends with a non-zero exit.
pub fn tool_cmd(app: &App, args: &ToolArgs) -> Result<()> {
    let registry = ToolRegistry::with_builtins();
    let arguments: serde_json::Value = serde_json::from_str(&args.args)
        .with_context(|| format!("--args is not valid JSON: {}", args.args))?;
    let data = app.open()?;
    let session = args
        .session
        .as_deref()
        .map(|s| resolve_session(&data, s))
        .transpose()?;
    let caller = if args.sub_agent {
        Caller::sub_agent(session, 1)
    } else {
        Caller::main_agent(session)
    };
    let lcm_search::DataDir { store, index, .. } = data;
    let ctx = ToolContext::new(store, Some(index), Arc::new(app.config.clone()), caller);
    let result = runtime()?.block_on(registry.call(&ctx, &args.name, arguments));
    match result {
        Ok(value) => print_json(app, &value),
        Err(error) => Err(anyhow::anyhow!("{error}")),
    }
}

/// `lcm tools --format openai|anthropic`: prints the tool definitions as a JSON array.
pub fn tools_cmd(app: &App, args: &ToolsArgs) -> Result<()> {
    let registry = ToolRegistry::with_builtins();
    let format = match args.format {
        DefinitionFormat::Openai => ToolFormat::OpenAi,
        DefinitionFormat::Anthropic => ToolFormat::Anthropic,
    };
    let definitions = if args.main_agent {
        registry.export_for(format, &Caller::main_agent(None))
    } else {
        registry.export(format)
    };
    print_json(app, &definitions)
}
