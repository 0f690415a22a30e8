//! Building the configured summariser and LLM clients.

use std::sync::Arc;
use std::time::Duration;

use lcm_core::config::{LlmConfig, ProviderKind};
use lcm_core::tokens::TokenCounter;

use crate::anthropic::AnthropicProvider;
use crate::chat::ChatProvider;
use crate::http::HttpConfig;
use crate::openai::OpenAiProvider;
use crate::provider::{Provider, ProviderError};
use crate::structured::StructuredSummarizer;
use crate::summarize::{LlmSummarizer, Summarizer};

/// The summariser `config` asks for: the offline one (default: structured, extractive for
/// conversation), or an LLM through an
/// OpenAI-compatible or Anthropic provider.
pub fn summarizer_from_config(
    config: &LlmConfig,
    counter: TokenCounter,
) -> Result<Arc<dyn Summarizer>, ProviderError> {
    let http = |default_url: &str| {
        let base = if config.base_url.is_empty() {
            default_url.to_owned()
        } else {
            config.base_url.clone()
        };
        HttpConfig::new(base, config.model.clone())
            .with_timeout(Duration::from_secs(config.timeout_s.max(1)))
            .with_max_retries(config.max_retries)
    };
    if config.provider != ProviderKind::Extractive && config.model.is_empty() {
        return Err(ProviderError::Config(format!(
            "llm.model must name a model when llm.provider is {:?}",
            config.provider
        )));
    }
    let provider: Arc<dyn Provider> = match config.provider {
        ProviderKind::Extractive => return Ok(Arc::new(StructuredSummarizer::new(counter))),
        ProviderKind::Openai => {
            Arc::new(OpenAiProvider::new(http(OpenAiProvider::DEFAULT_BASE_URL))?)
        }
        ProviderKind::Anthropic => Arc::new(AnthropicProvider::new(http(
            AnthropicProvider::DEFAULT_BASE_URL,
        ))?),
    };
    Ok(Arc::new(LlmSummarizer::new(
        provider,
        counter,
        config.model.clone(),
    )))
}

/// The model behind the runtime's operators and sub-agents: one client seen both as a plain
/// [`Provider`] (llm_map items) and as a [`ChatProvider`] (tool-calling sub-agents).
#[derive(Clone)]
pub struct LlmClients {
    /// Single stateless completions (llm_map items).
    pub provider: Arc<dyn Provider>,
    /// Chat with tool calls (sub-agents).
    pub chat: Arc<dyn ChatProvider>,
}

impl std::fmt::Debug for LlmClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LlmClients")
            .field("model", &self.chat.model())
            .finish()
    }
}

impl LlmClients {
    /// Both views of one client.
    pub fn new<P: Provider + ChatProvider + 'static>(client: Arc<P>) -> LlmClients {
        LlmClients {
            provider: Arc::clone(&client) as Arc<dyn Provider>,
            chat: client,
        }
    }
}

/// The LLM clients `config` describes, or `None` for the offline `extractive` setting (which has
/// no model for operators or sub-agents).
pub fn clients_from_config(config: &LlmConfig) -> Result<Option<LlmClients>, ProviderError> {
    if config.provider == ProviderKind::Extractive {
        return Ok(None);
    }
    if config.model.is_empty() {
        return Err(ProviderError::Config(format!(
            "llm.model must name a model when llm.provider is {:?}",
            config.provider
        )));
    }
    let http = |default_url: &str| {
        let base = if config.base_url.is_empty() {
            default_url.to_owned()
        } else {
            config.base_url.clone()
        };
        HttpConfig::new(base, config.model.clone())
            .with_timeout(Duration::from_secs(config.timeout_s.max(1)))
            .with_max_retries(config.max_retries)
    };
    Ok(Some(match config.provider {
        ProviderKind::Extractive => return Ok(None),
        ProviderKind::Openai => LlmClients::new(Arc::new(
            OpenAiProvider::new(http(OpenAiProvider::DEFAULT_BASE_URL))?
                .with_structured_output(config.structured_output),
        )),
        ProviderKind::Anthropic => LlmClients::new(Arc::new(AnthropicProvider::new(http(
            AnthropicProvider::DEFAULT_BASE_URL,
        ))?)),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use lcm_core::tokens::Encoding;

    #[test]
    fn default_is_offline_structured_and_llm_needs_a_model() {
        let counter = TokenCounter::new(Encoding::O200kBase);
        let s = summarizer_from_config(&LlmConfig::default(), counter).unwrap();
        assert_eq!(s.model(), crate::structured::STRUCTURED_MODEL);
        let config = LlmConfig {
            provider: ProviderKind::Openai,
            base_url: "http://127.0.0.1:9/v1".into(),
            ..LlmConfig::default()
        };
        let err = summarizer_from_config(&config, counter)
            .err()
            .map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("llm.model")));
    }
}
