//! Stop strings in streamed text.

/// The number of trailing bytes of `text` that must be held back because
/// they could be the start of a stop string: the length of the longest
/// suffix of `text` that is a prefix of one of `stops` (a complete stop
/// string counts too). Always on a character boundary of `text`.
pub fn stop_holdback<S: AsRef<str>>(text: &str, stops: &[S]) -> usize {
    let bytes = text.as_bytes();
    let mut best = 0;
    for stop in stops {
        let stop = stop.as_ref().as_bytes();
        let longest = stop.len().min(bytes.len());
        for k in (best + 1..=longest).rev() {
            // `text` ends with the first k bytes of a stop string: since
            // those start at a character boundary of the stop string (a
            // non-continuation byte), they start at one of `text` too.
            if bytes.ends_with(&stop[..k]) && text.is_char_boundary(bytes.len() - k) {
                best = k;
                break;
            }
        }
    }
    best
}

/// Finds stop strings in streamed text without ever releasing part of one.
///
/// Feed it pieces with [`StopMatcher::push`]: it releases the text that
/// can no longer belong to a stop string and holds back the longest
/// suffix that could still grow into one ([`stop_holdback`]). When a stop
/// string completes, it releases the text before it and reports which one
/// matched. Its buffers are reused, so pushing does not allocate once they
/// have grown to the longest stop string.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pub(super) held: String,
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new<S: AsRef<str>>(stops: &[S]) -> Self {
        let mut matcher = StopMatcher::default();
        matcher.set_stops(stops);
        matcher
    }

    /// Replaces the stop strings and forgets held text.
    pub fn set_stops<S: AsRef<str>>(&mut self, stops: &[S]) {
        self.stops.clear();
        self.stops.extend(stops.iter().map(|s| s.as_ref()).filter(|s| !s.is_empty()).map(str::to_owned));
        self.held.clear();
    }

    /// The stop strings.
    pub fn stops(&self) -> &[String] {
        &self.stops
    }

    /// Text held back because it could be the start of a stop string.
    pub fn held(&self) -> &str {
        &self.held
    }

    /// Adds `piece` and appends to `out` the text that is now certain not
    /// to be part of a stop string. Returns the index (into
    /// [`StopMatcher::stops`]) of a stop string that completed, the one
    /// that starts first if several did: `out` then ends right before it,
    /// and the held text is dropped.
    pub fn push(&mut self, piece: &str, out: &mut String) -> Option<usize> {
        self.held.push_str(piece);
        let mut found: Option<(usize, usize)> = None;
        for (i, stop) in self.stops.iter().enumerate() {
            if let Some(at) = self.held.find(stop.as_str())
                && found.is_none_or(|(best, _)| at < best)
            {
                found = Some((at, i));
            }
        }
        if let Some((at, i)) = found {
            out.push_str(&self.held[..at]);
            self.held.clear();
            return Some(i);
        }
        let cut = self.held.len() - stop_holdback(&self.held, &self.stops);
        out.push_str(&self.held[..cut]);
        self.held.drain(..cut);
        None
    }

    /// Appends the held text to `out` (at the end of a run that no stop
    /// string ended).
    pub fn flush(&mut self, out: &mut String) {
        out.push_str(&self.held);
        self.held.clear();
    }
}
