//! Loading a LoRA adapter changes the model's adapter set, which context
//! creation iterates (llama.cpp sizes the compute graph from it): the
//! model's adapter lock must keep the two apart; so does the first decode
//! after the adapters of a context change (it re-reserves the graph). This
//! test stops each of them in the middle, from llama.cpp's own log
//! message, and checks that an adapter load on another thread waits until
//! it is over. Without the lock the load finishes inside the pause.
//!
//! The pause hangs on llama.cpp's log reaching the `log` crate under the
//! target `llama.cpp`, which the test checks first.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::Duration;

use std::path::Path;

use llama_suite::synthetic::{TinyModelSpec, tiny_llama_path, write_tiny_lora};
use llamacpp::{AddBos, Batch, Model, ModelParams};

/// How long the paused creation waits for the load: far longer than a
/// load of the tiny adapter takes (milliseconds), so a load that is not
/// held back always finishes inside it.
const PAUSE: Duration = Duration::from_secs(3);

/// Channels between the paused call (in the logger) and the loader.
struct Pause {
    /// The log message to pause at.
    needle: &'static str,
    /// Tells the loader that the creation is paused inside llama.cpp.
    paused: Sender<()>,
    /// The loader reports that its load returned.
    loaded: Receiver<()>,
    /// Whether the load returned while the creation was paused.
    overlapped: Option<bool>,
}

static PAUSE_AT: Mutex<Option<Pause>> = Mutex::new(None);

/// Records of target `llama.cpp` at info level seen by the logger.
static LLAMA_CPP_INFO_RECORDS: AtomicUsize = AtomicUsize::new(0);

struct PausingLogger;

impl log::Log for PausingLogger {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        if record.target() != "llama.cpp" {
            return;
        }
        if record.level() == log::Level::Info {
            LLAMA_CPP_INFO_RECORDS.fetch_add(1, Ordering::Relaxed);
        }
        let message = record.args().to_string();
        // Take the pause out, so that the logging of other threads (the
        // loader's) does not wait on this lock during it.
        let taken = {
            let mut guard = PAUSE_AT.lock().unwrap();
            if guard.as_ref().is_some_and(|p| p.overlapped.is_none() && message.contains(p.needle)) {
                guard.take()
            } else {
                None
            }
        };
        if let Some(mut pause) = taken {
            pause.paused.send(()).unwrap();
            pause.overlapped = Some(pause.loaded.recv_timeout(PAUSE).is_ok());
            *PAUSE_AT.lock().unwrap() = Some(pause);
        }
    }

    fn flush(&self) {}
}

/// Runs `call` with a pause at the log message `needle`, during which
/// another thread loads `lora` into `model`; returns whether that load
/// finished inside the pause.
fn load_overlaps(model: &Model, lora: &Path, needle: &'static str, call: impl FnOnce()) -> Option<bool> {
    let (paused_tx, paused_rx) = channel();
    let (loaded_tx, loaded_rx) = channel();
    *PAUSE_AT.lock().unwrap() = Some(Pause { needle, paused: paused_tx, loaded: loaded_rx, overlapped: None });
    std::thread::scope(|scope| {
        let loader = scope.spawn(move || {
            paused_rx.recv().unwrap();
            let adapter = model.load_lora(lora).unwrap();
            // The receiver is gone once the pause is over; that is fine.
            let _ = loaded_tx.send(());
            drop(adapter);
        });
        call();
        loader.join().unwrap();
    });
    PAUSE_AT.lock().unwrap().take().and_then(|p| p.overlapped)
}

#[test]
fn adapter_loads_wait_for_context_creation_and_re_reserving_decodes() {
    log::set_logger(&PausingLogger).unwrap();
    log::set_max_level(log::LevelFilter::Info);
    let dir = tempfile::tempdir().unwrap();
    let lora = dir.path().join("lora.gguf");
    write_tiny_lora(&lora, &TinyModelSpec::default(), 4).unwrap();
    let model = Model::load(tiny_llama_path(&TinyModelSpec::default()).unwrap(), &ModelParams::default()).unwrap();
    // Loading a model logs at info level (its metadata, its buffers).
    assert!(LLAMA_CPP_INFO_RECORDS.load(Ordering::Relaxed) > 0, "llama.cpp's log did not reach the log crate");
    let params = llamacpp::ContextParams::default().n_ctx(256).n_threads(1);

    let overlapped = load_overlaps(&model, &lora, "constructing llama_context", || {
        drop(model.new_context(&params).unwrap());
    });
    assert_eq!(overlapped, Some(false), "the adapter load ran while the context was being created");

    let adapter = model.load_lora(&lora).unwrap();
    let mut ctx = model.new_context(&params).unwrap();
    ctx.set_lora_adapters(&[(&adapter, 1.0)]).unwrap();
    let tokens = model.vocab().tokenize("Hello", AddBos::Yes).unwrap();
    let overlapped = load_overlaps(&model, &lora, "reserving", || {
        ctx.decode(&Batch::from_tokens(&tokens, 0)).unwrap();
    });
    assert_eq!(overlapped, Some(false), "the adapter load ran while a decode re-reserved the graph");
}
