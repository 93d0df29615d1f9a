//! The constraint machinery of a build without the `constraints` feature
//! (no llguidance): [`TokenTable::build`] says the feature is missing, so
//! no [`Guide`] is ever made, and the types the sampler holds have no
//! values. A [`Constraint`](super::Constraint) can still be described; a
//! sampler built with one is this [`Error::Unsupported`].

use std::sync::Arc;

use super::Constraint;
use crate::error::{Error, Result};
use crate::llama::types::Token;
use crate::llama::vocab::Vocab;

fn unsupported() -> Error {
    Error::Unsupported(
        "constrained sampling (JSON Schema, regex, Lark): this build of llamacpp has no `constraints` feature".into(),
    )
}

/// llguidance's table of a vocabulary: none in this build.
#[derive(Debug)]
pub(crate) enum TokenTable {}

impl TokenTable {
    pub(crate) fn build(_vocab: &Vocab) -> Result<TokenTable> {
        Err(unsupported())
    }
}

/// A compiled constraint: none in this build (no [`TokenTable`] to
/// compile one against).
#[derive(Debug)]
pub(crate) enum Guide {}

/// The tokens a [`Guide`] allows: none in this build.
pub(crate) enum Mask {}

impl Guide {
    pub(crate) fn new(table: Arc<TokenTable>, _constraint: &Constraint) -> Result<Guide> {
        match *table {}
    }

    pub(crate) fn mask(&mut self) -> Result<&Mask> {
        match *self {}
    }

    pub(crate) fn allows(&mut self, _token: Token) -> Result<bool> {
        match *self {}
    }

    pub(crate) fn consume(&mut self, _token: Token) -> Result<()> {
        match *self {}
    }

    pub(crate) fn close_within(&mut self, _budget: Option<usize>) {
        match *self {}
    }

    pub(crate) fn reset(&mut self) -> Result<()> {
        match *self {}
    }

    pub(crate) fn deep_clone(&self) -> Guide {
        match *self {}
    }
}

impl Mask {
    pub(crate) fn iter_set_entries(&self, _f: impl FnMut(usize)) {
        match *self {}
    }

    pub(crate) fn iter_unset_entries(&self, _f: impl FnMut(usize)) {
        match *self {}
    }

    pub(crate) fn first_bit_set(&self) -> Option<usize> {
        match *self {}
    }

    pub(crate) fn num_set(&self) -> usize {
        match *self {}
    }

    pub(crate) fn is_allowed(&self, _token: u32) -> bool {
        match *self {}
    }
}

#[cfg(all(test, feature = "testing"))]
mod tests {
    use crate::sampling::constraint::Constraint;
    use crate::testing::{TinyModelSpec, tiny_llama_path};
    use crate::{Error, Model, ModelParams, SamplerChain, SamplingParams};

    /// Without the feature, every way to a constrained sampler says which
    /// feature is missing; GBNF grammars still work.
    #[test]
    fn constraints_are_unsupported_and_grammars_still_work() {
        let model = Model::load(tiny_llama_path(&TinyModelSpec::default()).unwrap(), &ModelParams::default()).unwrap();
        let unsupported = |e: Error| matches!(&e, Error::Unsupported(m) if m.contains("`constraints` feature"));
        assert!(unsupported(model.prepare_constraints().unwrap_err()));
        let chain = SamplerChain::new().constraint(&model, &Constraint::regex("a+")).greedy().build();
        assert!(unsupported(chain.unwrap_err()));
        let params =
            SamplingParams::default().constraint(Constraint::json_schema(serde_json::json!({"type": "integer"})));
        assert!(unsupported(params.sampler(&model).unwrap_err()));
        SamplerChain::new().grammar(model.vocab(), r#"root ::= "a"+"#, "root").greedy().build().unwrap();
    }
}
