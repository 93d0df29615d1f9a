//! Stop strings: the pure holdback logic, then forced token sequences
//! (exact UTF-8 over byte tokens, stops that span them).

use super::*;

fn feed(stops: &[&str], pieces: &[&str]) -> (Vec<String>, Option<usize>, String) {
    let mut matcher = StopMatcher::new(stops);
    let mut outs = Vec::new();
    for piece in pieces {
        let mut out = String::new();
        let hit = matcher.push(piece, &mut out);
        outs.push(out);
        if hit.is_some() {
            return (outs, hit, String::new());
        }
    }
    let mut rest = String::new();
    matcher.flush(&mut rest);
    (outs, None, rest)
}

#[test]
fn holdback_length() {
    assert_eq!(stop_holdback("Hello <EN", &["<END>"]), 3);
    assert_eq!(stop_holdback("Hello <", &["<END>"]), 1);
    assert_eq!(stop_holdback("Hello", &["<END>"]), 0);
    assert_eq!(stop_holdback("", &["<END>"]), 0);
    assert_eq!(stop_holdback("abc", &[] as &[&str]), 0);
    // The longest candidate over all stop strings.
    assert_eq!(stop_holdback("xab", &["b!", "abc"]), 2);
    // A complete stop string counts.
    assert_eq!(stop_holdback("x<END>", &["<END>"]), 5);
    // Multi-byte: only whole characters.
    assert_eq!(stop_holdback("你好世", &["世界"]), "世".len());
    assert_eq!(stop_holdback("é", &["\u{e9}x"]), 2);
    assert_eq!(stop_holdback("a\u{e9}", &["\u{a9}"]), 0);
}

#[test]
fn stop_split_across_three_pieces() {
    let (outs, hit, _) = feed(&["<END>"], &["Hello <", "EN", "D> more"]);
    assert_eq!(outs, ["Hello ", "", ""]);
    assert_eq!(hit, Some(0));
}

#[test]
fn false_start_is_released() {
    let (outs, hit, rest) = feed(&["</s>"], &["a <", "/x", "y"]);
    assert_eq!(outs, ["a ", "</x", "y"]);
    assert_eq!((hit, rest.as_str()), (None, ""));

    // A false start that overlaps a real one.
    let (outs, hit, _) = feed(&["abc"], &["ab", "ab", "c"]);
    assert_eq!(outs, ["", "ab", ""]);
    assert_eq!(hit, Some(0));

    // Held text comes out at the end when no stop string completes.
    let (outs, hit, rest) = feed(&["<END>"], &["x <E"]);
    assert_eq!((outs[0].as_str(), hit, rest.as_str()), ("x ", None, "<E"));
}

#[test]
fn earliest_stop_wins_and_empty_stops_are_ignored() {
    let (outs, hit, _) = feed(&["bc", "ab"], &["xabc"]);
    assert_eq!((outs[0].as_str(), hit), ("x", Some(1)));
    let matcher = StopMatcher::new(&["", "z"]);
    assert_eq!(matcher.stops(), ["z"]);
    let (outs, hit, _) = feed(&["", "z"], &["abc"]);
    assert_eq!((outs[0].as_str(), hit), ("abc", None));
    // A stop string inside one piece, with text after it.
    let (outs, hit, _) = feed(&["\n\n"], &["one\n", "\ntwo"]);
    assert_eq!(outs, ["one", ""]);
    assert_eq!(hit, Some(0));
    // Multi-byte stop split inside a piece boundary.
    let (outs, hit, _) = feed(&["世界"], &["你好世", "界!"]);
    assert_eq!(outs, ["你好", ""]);
    assert_eq!(hit, Some(0));
}

// Forced token sequences: exact UTF-8 and stop-string behaviour.

/// A selecting sampler that plays back a fixed token script.
#[derive(Clone)]
struct Script {
    tokens: Vec<i32>,
    next: usize,
}

impl llamacpp::CustomSampler for Script {
    fn apply(&mut self, candidates: &mut llamacpp::Candidates<'_>) {
        let want = self.tokens.get(self.next).copied().unwrap_or(llama_suite::synthetic::TINY_EOS_ID);
        if let Some(i) = candidates.data().iter().position(|c| c.id == want) {
            candidates.select(i).unwrap();
        }
    }
    fn accept(&mut self, _token: Token) {
        self.next += 1;
    }
    fn selects(&self) -> bool {
        true
    }
    fn clone_sampler(&self) -> Box<dyn llamacpp::CustomSampler> {
        Box::new(self.clone())
    }
}

/// The byte tokens of `text` (the tiny vocabulary has one per byte).
fn byte_tokens(text: &str) -> Vec<i32> {
    text.bytes().map(|b| llama_suite::synthetic::TINY_FIRST_BYTE_ID + i32::from(b)).collect()
}

fn run_script(script: Vec<i32>, options: &GenerateOptions) -> (Vec<String>, llamacpp::generate::GenerationStats) {
    let model = tiny_model();
    let mut ctx = model.new_context(&params(512, 512)).unwrap();
    let mut sampler = llamacpp::SamplerChain::new().custom(Script { tokens: script, next: 0 }).build().unwrap();
    let mut session = Session::new();
    let mut generation = session.generate(&mut ctx, &mut sampler, &prompt(5, 0), options).unwrap();
    let (pieces, error) = collect(&mut generation);
    assert!(error.is_none(), "{error:?}");
    (pieces, generation.stats().clone())
}

#[test]
fn multibyte_characters_split_over_byte_tokens_come_out_whole() {
    let text = "a你好😀é";
    let script = byte_tokens(text);
    let n = script.len();
    let (pieces, stats) = run_script(script, &GenerateOptions::default().max_tokens(n));
    assert_eq!(pieces, ["a", "你", "好", "😀", "é"]);
    assert_eq!(stats.incomplete_utf8_bytes, 0);
    assert_eq!(stats.generated_tokens, n);

    // Cut off inside a character: the rest comes out as U+FFFD at the end.
    let (pieces, stats) = run_script(byte_tokens(text), &GenerateOptions::default().max_tokens(n - 1));
    assert_eq!(pieces, ["a", "你", "好", "😀", "\u{FFFD}"]);
    assert_eq!(stats.incomplete_utf8_bytes, 1);

    // The script ends with EOS: finish reason EndOfGeneration.
    let (pieces, stats) = run_script(byte_tokens("ok"), &GenerateOptions::default());
    assert_eq!(pieces.concat(), "ok");
    assert_eq!(stats.finish_reason, Some(FinishReason::EndOfGeneration));
    assert_eq!(stats.generated_tokens, 3);
}

#[test]
fn multibyte_stop_string_over_byte_tokens_is_never_emitted() {
    let options = GenerateOptions::default().max_tokens(64).stop(["世界", "<END>"]);
    let (pieces, stats) = run_script(byte_tokens("你好世世界 after"), &options);
    assert_eq!(pieces.concat(), "你好世");
    assert_eq!(stats.finish_reason, Some(FinishReason::Stop("世界".into())));
    assert!(pieces.iter().all(|p| !p.contains('界')));

    // A false start of "<END>" is released once it cannot match any more.
    let (pieces, stats) = run_script(byte_tokens("x <EN y <END> z"), &options);
    assert_eq!(pieces.concat(), "x <EN y ");
    assert_eq!(stats.finish_reason, Some(FinishReason::Stop("<END>".into())));
    // Each piece is released only once it cannot be part of "<END>".
    assert!(pieces.iter().all(|p| !p.ends_with('<')), "{pieces:?}");
}

/// The matcher as it was (every stop string searched on every push, the
/// holdback stop by stop): the reference the automaton and trie must
/// agree with piece by piece.
fn naive_push(stops: &[String], held: &mut String, piece: &str, out: &mut String) -> Option<usize> {
    held.push_str(piece);
    let mut found: Option<(usize, usize)> = None;
    for (i, stop) in stops.iter().enumerate() {
        if let Some(at) = held.find(stop.as_str())
            && found.is_none_or(|(best, _)| at < best)
        {
            found = Some((at, i));
        }
    }
    if let Some((at, i)) = found {
        out.push_str(&held[..at]);
        held.clear();
        return Some(i);
    }
    let cut = held.len() - stop_holdback(held, stops);
    out.push_str(&held[..cut]);
    held.drain(..cut);
    None
}

proptest::proptest! {
    /// Random stop strings over a small alphabet (with a two-byte
    /// character), random text, random cuts: the same output per piece and
    /// the same stop as the naive search.
    #[test]
    fn the_stop_automaton_agrees_with_the_naive_search(
        stops in proptest::collection::vec("[ab<>é]{1,5}", 0..6),
        text in "[ab<>é ]{0,30}",
        cuts in proptest::collection::vec(0usize..31, 0..8),
    ) {
        let mut bounds: Vec<usize> = cuts.into_iter().filter(|&c| text.is_char_boundary(c.min(text.len()))).map(|c| c.min(text.len())).collect();
        bounds.extend([0, text.len()]);
        bounds.sort_unstable();
        bounds.dedup();
        let mut matcher = StopMatcher::new(&stops);
        let stops: Vec<String> = stops.into_iter().filter(|s| !s.is_empty()).collect();
        let mut held = String::new();
        for w in bounds.windows(2) {
            let piece = &text[w[0]..w[1]];
            let (mut ours, mut theirs) = (String::new(), String::new());
            let hit = matcher.push(piece, &mut ours);
            let expected = naive_push(&stops, &mut held, piece, &mut theirs);
            proptest::prop_assert_eq!((&ours, hit), (&theirs, expected), "stops {:?}, piece {:?}", &stops, piece);
            if hit.is_some() {
                break;
            }
            proptest::prop_assert_eq!(matcher.held(), held.as_str());
        }
    }
}

/// More than `MAX_STOPS` stop strings, or one longer than
/// `MAX_STOP_BYTES`, is refused before anything runs.
#[test]
fn stop_lists_are_bounded() {
    use llamacpp::generate::{MAX_STOP_BYTES, MAX_STOPS};
    let model = tiny_model();
    let mut ctx = model.new_context(&ContextParams::default().n_ctx(64)).unwrap();
    let mut sampler = Sampler::greedy();
    let mut session = Session::new();
    let prompt = [Token(TINY_BOS_ID), Token(5)];
    let many: Vec<String> = (0..=MAX_STOPS).map(|i| format!("stop {i}")).collect();
    let long = vec!["x".repeat(MAX_STOP_BYTES + 1)];
    for stops in [many.clone(), long] {
        let options = GenerateOptions::default().stop(stops);
        match session.generate(&mut ctx, &mut sampler, &prompt, &options) {
            Err(Error::InvalidParameter { name: "stop", .. }) => {}
            other => panic!("{other:?}"),
        }
    }
    let fine = GenerateOptions::default().max_tokens(1).stop(&many[..MAX_STOPS]);
    assert!(session.generate(&mut ctx, &mut sampler, &prompt, &fine).is_ok());
}
