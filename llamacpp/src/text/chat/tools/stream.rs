//! Reading calls out of the output as it streams: text before the calls
//! goes to the client at once, except a tail that may be the start of an
//! opener; each call is released when it is complete. [`parse`] is the
//! same reader given the whole output at once, so a streamed answer and a
//! whole one agree by construction (and the tests split outputs at every
//! byte to check it).

use super::ParsedCall;
use super::format::{Leading, ToolFormat};

/// What the reader releases.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ToolEvent {
    /// Text for the assistant message's `content`.
    Text(String),
    /// A complete call.
    Call(ParsedCall),
}

/// The reader of one choice's output.
#[derive(Clone, Debug)]
pub(crate) struct ToolStream {
    format: ToolFormat,
    /// At most one call (`parallel_tool_calls: false`).
    single: bool,
    output: String,
    /// Whether the start of the output has been read (see [`Leading`]).
    started: bool,
    /// Bytes of `output` released as text or skipped.
    released: usize,
    /// Where the calls start, once seen.
    calls_at: Option<usize>,
    calls_released: usize,
}

impl ToolStream {
    pub fn new(format: ToolFormat, parallel: bool) -> ToolStream {
        ToolStream {
            format,
            single: !parallel,
            output: String::new(),
            started: false,
            released: 0,
            calls_at: None,
            calls_released: 0,
        }
    }

    /// Reads the next piece of output.
    pub fn push(&mut self, piece: &str) -> Vec<ToolEvent> {
        self.output.push_str(piece);
        let mut events = Vec::new();
        if !self.started {
            match self.format.leading(&self.output) {
                Leading::Undecided => return events,
                Leading::Text { skip } => self.released = skip,
                Leading::Calls => self.calls_at = Some(0),
            }
            self.started = true;
        }
        if self.calls_at.is_none() {
            let rest = &self.output[self.released..];
            match self.format.openers().iter().filter_map(|o| rest.find(o)).min() {
                Some(at) => {
                    self.text(self.released + at, &mut events);
                    self.calls_at = Some(self.released);
                }
                None => {
                    let keep = held_back(rest, self.format.openers());
                    self.text(self.output.len() - keep, &mut events);
                }
            }
        }
        self.calls(&mut events);
        events
    }

    /// The output has ended: what was held back is released. Calls that
    /// opened but never completed are given back as text, when no call
    /// completed before them.
    pub fn finish(&mut self) -> Vec<ToolEvent> {
        let mut events = Vec::new();
        if self.calls_at.is_some() {
            self.calls(&mut events);
            if self.calls_released == 0 {
                self.calls_at = None;
            }
        }
        if self.calls_at.is_none() {
            self.text(self.output.len(), &mut events);
        }
        events
    }

    /// Whether any call was released.
    #[cfg(test)]
    pub fn called(&self) -> bool {
        self.calls_released > 0
    }

    fn text(&mut self, up_to: usize, events: &mut Vec<ToolEvent>) {
        if up_to > self.released {
            events.push(ToolEvent::Text(self.output[self.released..up_to].to_owned()));
            self.released = up_to;
        }
    }

    fn calls(&mut self, events: &mut Vec<ToolEvent>) {
        let Some(at) = self.calls_at else { return };
        let calls = self.format.calls(&self.output[at..]);
        let limit = if self.single { 1 } else { usize::MAX };
        for call in calls.into_iter().take(limit).skip(self.calls_released) {
            events.push(ToolEvent::Call(call));
            self.calls_released += 1;
        }
    }
}

/// The longest tail of `text` that is the start of an opener (at a
/// character boundary).
fn held_back(text: &str, openers: &[&str]) -> usize {
    openers
        .iter()
        .flat_map(|o| (1..o.len()).filter(|&n| o.is_char_boundary(n)).map(move |n| &o[..n]))
        .filter(|prefix| text.ends_with(prefix))
        .map(str::len)
        .max()
        .unwrap_or(0)
}

/// A whole output read at once: its text and its calls.
#[cfg(test)]
pub(crate) fn parse(format: ToolFormat, parallel: bool, output: &str) -> (String, Vec<ParsedCall>) {
    let mut reader = ToolStream::new(format, parallel);
    let mut events = reader.push(output);
    events.extend(reader.finish());
    gather(events)
}

/// Released events as the text they add up to and the calls, in order.
#[cfg(test)]
pub(super) fn gather(events: impl IntoIterator<Item = ToolEvent>) -> (String, Vec<ParsedCall>) {
    let mut text = String::new();
    let mut calls = Vec::new();
    for e in events {
        match e {
            ToolEvent::Text(t) => text.push_str(&t),
            ToolEvent::Call(c) => calls.push(c),
        }
    }
    (text, calls)
}
