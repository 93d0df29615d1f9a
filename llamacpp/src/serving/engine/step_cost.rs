//! What a step costs by its rows, fitted as the engine runs: it tells
//! speculative drafting how long a draft still pays for itself.
//!
//! A decode step costs a fixed part (reading the weights once) plus a part
//! per row with logits (the row's share of the matrix products, its output
//! layer, its sampling). Without drafts, each of `s` streams gets one token
//! per step, so a token costs `fixed / s + per_row` of the machine's time.
//! A draft token costs one more row, `per_row`, and saves a future token
//! when it is accepted. Its `j`-th token is kept only if the `j` before it
//! were, with probability `q^j` for a sequence whose draft tokens are
//! accepted at rate `q`: it pays while `q^j · (fixed / s + per_row) >
//! per_row`. Where the fixed part dominates (one stream, or a GPU) drafts
//! run long; where the rows do (many streams on a few CPU cores, where a
//! row costs as much as a token) they stop, and speculation costs nothing.

/// The weight a step's sample keeps per later step: about the last 50
/// steps count.
const DECAY: f64 = 0.98;
/// Decode steps seen before the fit is used (before it, drafts are not
/// limited by cost).
const MIN_STEPS: f64 = 8.0;
/// The least variance of the rows (rows²) that fits a slope: steps that all
/// had about the same rows keep the fit they had.
const MIN_VARIANCE: f64 = 0.5;

/// Step time ≈ `fixed + per_row × rows`, fitted by exponentially weighted
/// least squares over recent decode steps.
#[derive(Debug, Default)]
pub(crate) struct StepCost {
    /// Weighted count, and sums of rows, seconds, rows², rows × seconds.
    n: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
    /// The last fit: (fixed, per row), in seconds.
    fit: Option<(f64, f64)>,
}

impl StepCost {
    /// Records a decode step of `rows` rows with logits (and no prompt
    /// rows) that took `secs`.
    pub fn record(&mut self, rows: usize, secs: f64) {
        if rows == 0 || !secs.is_finite() || secs <= 0.0 {
            return;
        }
        let x = rows as f64;
        self.n = self.n * DECAY + 1.0;
        self.x = self.x * DECAY + x;
        self.y = self.y * DECAY + secs;
        self.xx = self.xx * DECAY + x * x;
        self.xy = self.xy * DECAY + x * secs;
        if self.n < MIN_STEPS {
            return;
        }
        let (mx, my) = (self.x / self.n, self.y / self.n);
        let var = self.xx / self.n - mx * mx;
        if var < MIN_VARIANCE {
            return;
        }
        let per_row = ((self.xy / self.n - mx * my) / var).max(0.0);
        let fixed = (my - per_row * mx).max(0.0);
        self.fit = Some((fixed, per_row));
    }

    /// The fit so far: (fixed, per row) in seconds.
    pub fn fit(&self) -> Option<(f64, f64)> {
        self.fit
    }

    /// The longest draft that pays for a sequence whose draft tokens are
    /// accepted at rate `acceptance`, in a step where `streams` sequences
    /// sample one token each: `usize::MAX` while there is no fit.
    pub fn draft_limit(&self, streams: usize, acceptance: f64) -> usize {
        let Some((fixed, per_row)) = self.fit else { return usize::MAX };
        let per_token = fixed / streams.max(1) as f64 + per_row;
        if per_row <= 0.0 || acceptance >= 1.0 {
            return usize::MAX;
        }
        // The j-th draft token pays while acceptance^j > per_row / per_token.
        let break_even = per_row / per_token;
        if acceptance <= 0.0 || break_even >= 1.0 {
            return 0;
        }
        let j = break_even.ln() / acceptance.ln();
        // Strictly above break-even: j itself pays only if it is not whole.
        if j >= usize::MAX as f64 { usize::MAX } else { j.ceil() as usize - 1 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fitted(fixed: f64, per_row: f64, rows: impl IntoIterator<Item = usize>) -> StepCost {
        let mut cost = StepCost::default();
        for r in rows {
            cost.record(r, fixed + per_row * r as f64);
        }
        cost
    }

    #[test]
    fn fits_the_fixed_and_per_row_parts() {
        let cost = fitted(0.014, 0.0047, (0..40).map(|i| 1 + i % 9));
        let (fixed, per_row) = cost.fit().unwrap();
        assert!((fixed - 0.014).abs() < 1e-9, "{fixed}");
        assert!((per_row - 0.0047).abs() < 1e-9, "{per_row}");
    }

    #[test]
    fn no_limit_before_enough_varied_steps() {
        // Too few steps.
        let cost = fitted(0.0, 0.007, [8, 9, 10, 11, 12]);
        assert_eq!(cost.draft_limit(8, 0.9), usize::MAX);
        // Rows that never vary fit no slope.
        let cost = fitted(0.0, 0.007, [8; 40]);
        assert_eq!(cost.fit(), None);
        assert_eq!(cost.draft_limit(8, 0.9), usize::MAX);
        // A fit stays while the rows stop varying (the weighted variance
        // falls to rounding noise, which would fit any slope).
        let mut cost = fitted(0.0, 0.007, (0..40).map(|i| 8 + i % 9));
        for _ in 0..1000 {
            cost.record(8, 0.056);
        }
        let (fixed, per_row) = cost.fit().unwrap();
        assert!(fixed.abs() < 1e-9 && (per_row - 0.007).abs() < 1e-9, "{fixed} {per_row}");
    }

    #[test]
    fn drafts_pay_where_the_fixed_part_dominates() {
        // One stream, 14 ms fixed, 4.7 ms a row: break-even at 0.25.
        let cost = fitted(0.014, 0.0047, (0..40).map(|i| 1 + i % 17));
        // 0.94^22 = 0.256 > 0.25 > 0.94^23.
        assert_eq!(cost.draft_limit(1, 0.94), 22);
        // 0.5 > 0.25 = 0.5^2: one token.
        assert_eq!(cost.draft_limit(1, 0.5), 1);
        assert_eq!(cost.draft_limit(1, 1.0), usize::MAX);
        assert_eq!(cost.draft_limit(1, 0.0), 0);
        // Eight streams share the fixed part: break-even at 0.73.
        assert_eq!(cost.draft_limit(8, 0.94), 5);
    }

    #[test]
    fn no_drafts_where_a_row_costs_a_token() {
        // Many streams on few cores: no fixed part to share.
        let cost = fitted(0.0, 0.007, (0..40).map(|i| 8 + i % 9));
        assert_eq!(cost.draft_limit(8, 0.99), 0);
        assert_eq!(cost.draft_limit(1, 0.99), 0);
        // Free rows: no limit.
        let cost = fitted(0.05, 0.0, (0..40).map(|i| 8 + i % 9));
        assert_eq!(cost.draft_limit(8, 0.3), usize::MAX);
    }

    #[test]
    fn ignores_empty_and_broken_samples() {
        let mut cost = fitted(0.014, 0.0047, (0..40).map(|i| 1 + i % 9));
        let before = cost.fit();
        cost.record(0, 1.0);
        cost.record(4, f64::NAN);
        cost.record(4, -1.0);
        assert_eq!(cost.fit(), before);
    }
}
