//! Building the configured summariser.

use std::sync::Arc;
use std::time::Duration;

use lcm_core::config::{LlmConfig, ProviderKind};
use lcm_core::tokens::TokenCounter;

use crate::anthropic::AnthropicProvider;
use crate::extractive::ExtractiveSummarizer;
use crate::http::HttpConfig;
use crate::openai::OpenAiProvider;
use crate::provider::{Provider, ProviderError};
use crate::summarize::{LlmSummarizer, Summarizer};

/// The summariser `config` asks for: the extractive one (default, offline), or an LLM through an
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
        ProviderKind::Extractive => return Ok(Arc::new(ExtractiveSummarizer::new(counter))),
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

#[cfg(test)]
mod tests {
    use super::*;
    use lcm_core::tokens::Encoding;

    #[test]
    fn default_is_extractive_and_llm_needs_a_model() {
        let counter = TokenCounter::new(Encoding::O200kBase);
        let s = summarizer_from_config(&LlmConfig::default(), counter).unwrap();
        assert_eq!(s.model(), ExtractiveSummarizer::new(counter).model());
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
