//! Progress on a terminal: indicatif hides it when stderr is not one.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressFinish, ProgressStyle};

/// A byte progress bar on stderr; indicatif hides it when stderr is not a
/// terminal, and it clears itself when dropped.
pub(crate) fn byte_bar(total: u64, message: &'static str) -> ProgressBar {
    let style = ProgressStyle::with_template("{msg:>11} [{bar:40}] {bytes}/{total_bytes} ({bytes_per_sec}, eta {eta})")
        .map(|style| style.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar());
    ProgressBar::new(total).with_style(style).with_message(message).with_finish(ProgressFinish::AndClear)
}

/// A spinner on stderr, hidden when stderr is not a terminal.
pub(crate) fn spinner(message: String) -> ProgressBar {
    let bar = ProgressBar::new_spinner().with_message(message).with_finish(ProgressFinish::AndClear);
    bar.enable_steady_tick(Duration::from_millis(100));
    bar
}
