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

/// At most this many stop strings per generation (the engine and
/// [`Session::generate`](super::Session::generate) refuse more with
/// [`Error::InvalidParameter`](crate::Error::InvalidParameter) `stop`).
pub const MAX_STOPS: usize = 32;

/// At most this many bytes per stop string.
pub const MAX_STOP_BYTES: usize = 256;

/// Refuses more than [`MAX_STOPS`] stop strings or one longer than
/// [`MAX_STOP_BYTES`]: each token's text is matched against them all.
pub(crate) fn check_stops(stops: &[String]) -> crate::Result<()> {
    let invalid = |message: String| crate::Error::InvalidParameter { name: "stop", message };
    if stops.len() > MAX_STOPS {
        return Err(invalid(format!("at most {MAX_STOPS} stop strings, got {}", stops.len())));
    }
    if let Some(long) = stops.iter().find(|s| s.len() > MAX_STOP_BYTES) {
        return Err(invalid(format!("a stop string may have at most {MAX_STOP_BYTES} bytes, got {}", long.len())));
    }
    Ok(())
}

/// Finds stop strings in streamed text without ever releasing part of one.
///
/// Feed it pieces with [`StopMatcher::push`]: it releases the text that
/// can no longer belong to a stop string and holds back the longest
/// suffix that could still grow into one ([`stop_holdback`]). When a stop
/// string completes, it releases the text before it and reports which one
/// matched. Its buffers are reused, so pushing does not allocate once they
/// have grown to the longest stop string.
///
/// The cost of a push does not grow with the number of stop strings: one
/// Aho-Corasick automaton finds a completed one, and a trie of all of them
/// finds the suffix to hold back (walked from each position of the last
/// longest-stop bytes, so at most that length squared, in steps that stop
/// at the first byte no stop string continues with).
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pub(super) held: String,
    /// Every stop string, leftmost match first (the earliest-listed one
    /// among those that start at the same byte).
    automaton: Option<aho_corasick::AhoCorasick>,
    /// The stop strings' bytes as a trie: `trie[node]` lists `(byte,
    /// child)`; node 0 is the root.
    trie: Vec<Vec<(u8, u32)>>,
    longest: usize,
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
        let stops: Vec<&str> = stops.iter().map(|s| s.as_ref()).filter(|s| !s.is_empty()).collect();
        self.held.clear();
        if stops.iter().copied().eq(self.stops.iter().map(String::as_str)) {
            return;
        }
        self.stops = stops.iter().map(|s| (*s).to_owned()).collect();
        self.automaton = (!self.stops.is_empty())
            .then(|| {
                // A contiguous NFA builds in time linear in the patterns'
                // bytes (a DFA over 32 stop strings of 256 bytes took most
                // of a second), and searches these short texts as fast.
                aho_corasick::AhoCorasick::builder()
                    .match_kind(aho_corasick::MatchKind::LeftmostFirst)
                    .kind(Some(aho_corasick::AhoCorasickKind::ContiguousNFA))
                    .build(&self.stops)
                    .ok()
            })
            .flatten();
        self.trie = vec![Vec::new()];
        for stop in &self.stops {
            let mut node = 0;
            for &b in stop.as_bytes() {
                node = match self.trie[node].iter().find(|(byte, _)| *byte == b) {
                    Some(&(_, child)) => child as usize,
                    None => {
                        self.trie.push(Vec::new());
                        let child = self.trie.len() - 1;
                        self.trie[node].push((b, child as u32));
                        child
                    }
                };
            }
        }
        self.longest = self.stops.iter().map(String::len).max().unwrap_or(0);
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
        if let Some(found) = self.automaton.as_ref().and_then(|a| a.find(self.held.as_str())) {
            out.push_str(&self.held[..found.start()]);
            self.held.clear();
            return Some(found.pattern().as_usize());
        }
        let cut = self.held.len() - self.holdback();
        out.push_str(&self.held[..cut]);
        self.held.drain(..cut);
        None
    }

    /// [`stop_holdback`] of the held text, through the trie.
    fn holdback(&self) -> usize {
        let bytes = self.held.as_bytes();
        let from = bytes.len().saturating_sub(self.longest);
        // The first start (from the left) whose rest is a path in the trie
        // is the longest suffix that begins a stop string.
        (from..bytes.len())
            .find(|&p| {
                self.held.is_char_boundary(p)
                    && bytes[p..]
                        .iter()
                        .try_fold(0usize, |node, b| {
                            self.trie[node].iter().find(|(byte, _)| byte == b).map(|&(_, child)| child as usize)
                        })
                        .is_some()
            })
            .map_or(0, |p| bytes.len() - p)
    }

    /// Appends the held text to `out` (at the end of a run that no stop
    /// string ended).
    pub fn flush(&mut self, out: &mut String) {
        out.push_str(&self.held);
        self.held.clear();
    }
}
