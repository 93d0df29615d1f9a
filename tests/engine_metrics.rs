//! The engine reports through the `metrics` facade: with a recorder
//! installed (this binary's only test, since the recorder is global), its
//! counters, gauges and histograms carry the values of `Engine::stats`,
//! idle and while one request runs and another waits.

use std::collections::HashMap;
use std::sync::Arc;

use llama_suite::synthetic::{TINY_BOS_ID, TinyModelSpec, tiny_llama_path};
use llamacpp::engine::{Engine, EngineConfig, Request};
use llamacpp::{Model, ModelParams, Token};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

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

    let Series { counters, histograms, gauges } = Series::read(&snapshotter);
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
    // Idle: the gauges carry the last published stats, cells included.
    assert_eq!(gauges.get("llama_engine_running"), Some(&0.0));
    assert_eq!(gauges.get("llama_engine_waiting"), Some(&0.0));
    assert!(stats.kv_cells_total >= 1024 && stats.cached_prefix_cells > 0, "{stats:?}");
    assert_eq!(gauges.get("llama_engine_kv_cells_total"), Some(&(stats.kv_cells_total as f64)));
    assert_eq!(gauges.get("llama_engine_kv_cells_used"), Some(&(stats.kv_cells_used as f64)));
    assert_eq!(gauges.get("llama_engine_cached_prefix_cells"), Some(&(stats.cached_prefix_cells as f64)));

    // Busy: one request runs and one waits (one running at most), and the
    // gauges say so while it lasts.
    let model = Arc::new(Model::load(&path, &ModelParams::default()).unwrap());
    let engine = Engine::start(model, EngineConfig::default().n_ctx(1024).n_threads(1).max_running(1)).unwrap();
    let long = || Request::tokens(prompt.clone()).max_tokens(900).stop_at_eog(false);
    let running = engine.submit(long()).unwrap();
    let waiting = engine.submit(long()).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    // The recorder's own snapshot is what is checked: the engine's stats
    // and a later read of the recorder could straddle a step. The gauges
    // are set one by one, so a snapshot can also fall inside a publish
    // (running and waiting already set, the cells not yet): wait for one
    // that shows the whole busy state.
    let busy = loop {
        let series = Series::read(&snapshotter);
        let gauge = |name: &str| series.gauges.get(name).copied();
        // The total too: the previous engine's shutdown left it at 0 until
        // this one's publish reaches it (CI caught a snapshot in between).
        if gauge("llama_engine_running") == Some(1.0)
            && gauge("llama_engine_waiting") == Some(1.0)
            && gauge("llama_engine_kv_cells_used").is_some_and(|used| used > 0.0)
            && gauge("llama_engine_kv_cells_total") == Some(stats.kv_cells_total as f64)
        {
            break series;
        }
        assert!(std::time::Instant::now() < deadline, "never one running and one waiting: {:?}", engine.stats());
        std::thread::yield_now();
    };
    running.cancel();
    waiting.cancel();
    drop(engine);
    assert_eq!(busy.gauges.get("llama_engine_running"), Some(&1.0));
    assert_eq!(busy.gauges.get("llama_engine_waiting"), Some(&1.0));
    assert_eq!(busy.gauges.get("llama_engine_kv_cells_total"), Some(&(stats.kv_cells_total as f64)));
}

/// The recorder's series by name (counters and gauges with their labels
/// joined, histograms by their sample count).
struct Series {
    counters: HashMap<(String, String), u64>,
    histograms: HashMap<String, usize>,
    gauges: HashMap<String, f64>,
}

impl Series {
    fn read(snapshotter: &Snapshotter) -> Series {
        let mut series = Series { counters: HashMap::new(), histograms: HashMap::new(), gauges: HashMap::new() };
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            let name = key.key().name().to_owned();
            let labels: Vec<String> = key.key().labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
            match value {
                DebugValue::Counter(n) => *series.counters.entry((name, labels.join(","))).or_insert(0) += n,
                DebugValue::Histogram(v) => {
                    series.histograms.insert(name, v.len());
                }
                DebugValue::Gauge(v) => {
                    series.gauges.insert(name, v.into_inner());
                }
            }
        }
        series
    }
}
