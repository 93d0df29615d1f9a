//! The model's vocabulary as llguidance sees it: each token's bytes in a
//! trie, built once per model and shared by every constrained request.

use std::sync::{Arc, OnceLock};

use llguidance::ParserFactory;
use llguidance::api::ParserLimits;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};

use super::closing::ClosingSets;
use super::{STEP_LEXER_FUEL, STEP_MAX_ITEMS};
use crate::error::{Error, Result};
use crate::llama::types::Token;
use crate::llama::vocab::{Special, Vocab};

/// llguidance's grammar compiler for one model's vocabulary: its token
/// trie and the per-vocabulary tables its masks are computed with.
pub(crate) struct TokenTable {
    pub(crate) factory: ParserFactory,
    /// The token sets of the closing rule, built on first use.
    closing: OnceLock<ClosingSets>,
}

impl std::fmt::Debug for TokenTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenTable").field("n_vocab", &self.factory.tok_env().tok_trie().vocab_size()).finish()
    }
}

impl TokenTable {
    /// The token sets of [`Sampler::close_within`](crate::Sampler::close_within)'s rule.
    pub(crate) fn closing_sets(&self) -> &ClosingSets {
        self.closing.get_or_init(|| ClosingSets::build(self.factory.tok_env().tok_trie()))
    }

    /// Builds the table of `vocab`: every token's text as llama.cpp
    /// renders it, control tokens as `0xFF` + their markup (llguidance's
    /// convention for tokens no text can produce), the end-of-generation
    /// tokens as the tokens that end a document.
    pub(crate) fn build(vocab: &Vocab) -> Result<TokenTable> {
        let n = vocab.n_tokens();
        let mut words = Vec::with_capacity(n);
        let mut eog = Vec::new();
        for id in 0..n as i32 {
            let token = Token(id);
            let mut bytes = vocab.token_to_piece(token, Special::Plain)?;
            if bytes.is_empty() {
                let markup = vocab.token_to_piece(token, Special::Markup)?;
                if !markup.is_empty() {
                    bytes = Vec::with_capacity(markup.len() + 1);
                    bytes.push(0xFF);
                    bytes.extend_from_slice(&markup);
                }
            }
            words.push(bytes);
            if vocab.is_eog(token) {
                eog.push(id as u32);
            }
        }
        let eos = vocab.eos().or_else(|| vocab.eot()).map(|t| t.0 as u32).or_else(|| eog.first().copied());
        let Some(eos) = eos else {
            return Err(Error::Grammar(
                "the model has no end-of-generation token to end a constrained document".into(),
            ));
        };
        if eog.is_empty() {
            eog.push(eos);
        }
        let mut info = TokRxInfo::new(n as u32, eos);
        info.tok_bos = vocab.bos().map(|t| t.0 as u32);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&eog);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| Error::Grammar(e.to_string()))?;
        factory.quiet();
        *factory.limits_mut() = ParserLimits {
            step_max_items: STEP_MAX_ITEMS,
            step_lexer_fuel: STEP_LEXER_FUEL,
            // Errors name the grammar's problem, not its whole state.
            verbose_errors: false,
            ..ParserLimits::default()
        };
        Ok(TokenTable { factory, closing: OnceLock::new() })
    }
}
