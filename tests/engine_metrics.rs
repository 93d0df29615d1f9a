//! The engine reports through the `metrics` facade: with a recorder
//! installed (this binary's only test, since the recorder is global), its
//! counters, gauges and histograms carry the values of `Engine::stats`.

use std::sync::Arc;

use llama::engine::{Engine, EngineConfig, Request};
use llama::{Model, ModelParams, Token};
use llama_suite::synthetic::{TINY_BOS_ID, TinyModelSpec, tiny_llama_path};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

#[test]
fn counters_gauges_and_histograms_reach_the_installed_recorder() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().expect("the only recorder of this test binary");

    let path = tiny_llama_path(&TinyModelSpec::default()).unwrap();
    let model = Arc::new(Model::load(&path, &ModelParams::default()).unwrap());
    let engine = Engine::start(model, EngineConfig::default().n_ctx(1024).n_threads(1)).unwrap();
    let prompt: Vec<Token> = std::iter::once(Token(TINY_BOS_ID)).chain((300..320).map(Token)).collect();
    for _ in 0..3 {
        let out = engine.submit(Request::tokens(prompt.clone()).max_tokens(5).stop_at_eog(false)).unwrap().wait();
        assert_eq!(out.finish.usage.completion_tokens, 5);
    }
    // The worker publishes after each step; the last request has ended, so
    // one more step-free publish has happened before `wait` returned? Not
    // necessarily: wait until the stats show it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while engine.stats().running > 0 {
        assert!(std::time::Instant::now() < deadline);
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let stats = engine.stats();
    drop(engine);

    let mut counters = std::collections::HashMap::new();
    let mut histograms = std::collections::HashMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let name = key.key().name().to_owned();
        let labels: Vec<String> = key.key().labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
        match value {
            DebugValue::Counter(n) => {
                *counters.entry((name, labels.join(","))).or_insert(0) += n;
            }
            DebugValue::Histogram(v) => {
                histograms.insert(name, v.len());
            }
            DebugValue::Gauge(_) => {}
        }
    }
    let counter = |name: &str, labels: &str| counters.get(&(name.to_owned(), labels.to_owned())).copied();
    assert_eq!(counter("llama_engine_completion_tokens_total", ""), Some(15));
    assert_eq!(counter("llama_engine_requests_total", "reason=length"), Some(3));
    assert_eq!(counter("llama_engine_prompt_tokens_total", ""), Some(63));
    assert_eq!(counter("llama_engine_steps_total", ""), Some(stats.steps));
    // The second and third request shared the first one's prompt (all but
    // its last token, whose logits are needed).
    assert_eq!(counter("llama_engine_prefix_hit_tokens_total", ""), Some(2 * 20));
    assert_eq!(counter("llama_engine_prompt_tokens_evaluated_total", ""), Some(21 + 1 + 1));
    assert_eq!(histograms.get("llama_engine_ttft_seconds"), Some(&3));
    assert_eq!(histograms.get("llama_engine_inter_token_seconds"), Some(&12));
    assert_eq!(histograms.get("llama_engine_e2e_seconds"), Some(&3));
    assert_eq!(histograms.get("llama_engine_queue_seconds"), Some(&3));
}
