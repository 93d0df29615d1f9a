//! The engine's media without the `mtmd` feature: no request has any.

use std::sync::Arc;

use crate::error::Result;
use crate::llama::context::Context;
use crate::llama::model::Model;
use crate::llama::types::{SeqId, Token};
use crate::llama::vocab::{AddBos, Special, Vocab};

#[derive(Clone, Debug, Default)]
pub(crate) struct MediaConfig {}

#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Attached {}

impl Attached {
    pub fn is_empty(&self) -> bool {
        true
    }

    pub fn len(&self) -> usize {
        0
    }
}

#[derive(Debug, Default)]
pub(crate) struct Spans {}

impl Spans {
    pub fn starting_at(&self, _pos: usize) -> Option<usize> {
        None
    }

    pub fn next_start_after(&self, _pos: usize) -> Option<usize> {
        None
    }
}

/// Never made: there is no projector to load.
#[derive(Debug)]
pub(crate) enum EngineMedia {}

impl EngineMedia {
    pub fn load(_model: &Arc<Model>, _config: &MediaConfig) -> Result<Option<Arc<EngineMedia>>> {
        Ok(None)
    }

    pub fn split_text(
        &self,
        _vocab: &Vocab,
        _text: &str,
        _n: usize,
        _add_bos: AddBos,
        _special: Special,
    ) -> Result<(Vec<Token>, Vec<usize>)> {
        match *self {}
    }

    pub fn splice(
        &self,
        _tokens: Vec<Token>,
        _at: &[usize],
        _media: &Attached,
        _n_ubatch: usize,
    ) -> Result<(Vec<Token>, Spans)> {
        match *self {}
    }

    pub fn decode(&self, _ctx: &mut Context<'_>, _spans: &Spans, _pos: usize, _seq: SeqId) -> Result<()> {
        match *self {}
    }
}
