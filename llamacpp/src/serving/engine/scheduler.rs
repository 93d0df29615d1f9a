//! The engine's policy, as pure functions of counts: how a step's token
//! budget is shared, and whom to preempt. No FFI, no model: the unit tests
//! below check fairness and preemption order in microseconds.

/// What the scheduler knows about one admitted sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Load {
    /// Tokens that still have to go through the model before the next
    /// sample: 1 for a decoding sequence, the uncached part of the prompt
    /// for a prefilling one.
    pub remaining: usize,
    /// Generating (one token per step) rather than prefilling.
    pub decoding: bool,
}

/// Shares one step's budget of `budget` tokens. Every decoding sequence
/// gets its one token first (the oldest first, should there be more of
/// them than the budget). The prefilling sequences share what is left:
/// the oldest of them is guaranteed a quarter of it (so a stream of short
/// prompts cannot starve a long one), and the rest goes to the prompts
/// with the fewest tokens left first, the oldest first among equals.
///
/// While the step has something to protect (a sequence decoding, or a
/// prompt that fits in `prefill_cap` beside one that does not), each
/// prompt gets at most `prefill_cap` tokens: one long prompt then delays
/// running streams and short requests by at most a short step, while
/// several prompts waiting together still fill the budget (a burst of
/// arrivals starts generating as fast as without the cap). With nothing
/// to protect there is no cap: a lone prompt gets the whole budget.
///
/// Shortest-remaining first minimises the mean time to first token: a
/// short prompt that arrives during a long prefill finishes its prefill in
/// the next step, and prompts that arrive together start generating one
/// after another instead of all at the end.
///
/// `loads` are in admission order (oldest first); `out[i]` receives the
/// tokens of `loads[i]` in this step (0: none).
pub(crate) fn split_budget(budget: usize, prefill_cap: usize, loads: &[Load], out: &mut Vec<usize>) {
    out.clear();
    out.resize(loads.len(), 0);
    let mut left = budget;
    let mut decoding = false;
    for (i, load) in loads.iter().enumerate() {
        if load.decoding && load.remaining > 0 && left > 0 {
            out[i] = 1;
            left -= 1;
            decoding = true;
        }
    }
    let mut prefills: Vec<usize> = (0..loads.len()).filter(|&i| !loads[i].decoding && loads[i].remaining > 0).collect();
    let Some(&oldest) = prefills.first() else {
        return;
    };
    let short = prefills.iter().any(|&i| loads[i].remaining <= prefill_cap);
    let long = prefills.iter().any(|&i| loads[i].remaining > prefill_cap);
    let protect = decoding || short && long;
    let cap = if protect { prefill_cap.max(1) } else { usize::MAX };
    let floor = loads[oldest].remaining.min(left.div_ceil(4)).min(cap);
    out[oldest] = floor;
    left -= floor;
    // Stable: equal needs keep admission order.
    prefills.sort_by_key(|&i| loads[i].remaining - out[i]);
    for &i in &prefills {
        let take = (loads[i].remaining.min(cap) - out[i]).min(left);
        out[i] += take;
        left -= take;
    }
}

/// What the preemption rule knows about one running sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    /// Higher runs first.
    pub priority: i32,
    /// When it was (last) admitted: larger is more recent.
    pub admitted: u64,
}

/// The sequence to preempt when the pool has no room: the lowest
/// priority, and among those the most recently admitted (it has the least
/// work to redo, and the oldest requests keep going). `None` for an empty
/// slice.
pub(crate) fn victim(candidates: &[Candidate]) -> Option<usize> {
    (0..candidates.len()).min_by_key(|&i| (candidates[i].priority, std::cmp::Reverse(candidates[i].admitted)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec() -> Load {
        Load { remaining: 1, decoding: true }
    }
    fn pre(n: usize) -> Load {
        Load { remaining: n, decoding: false }
    }
    fn run(budget: usize, cap: usize, loads: &[Load]) -> Vec<usize> {
        let mut out = Vec::new();
        split_budget(budget, cap, loads, &mut out);
        let total: usize = out.iter().sum();
        assert!(total <= budget, "{out:?} exceeds {budget}");
        for (o, l) in out.iter().zip(loads) {
            assert!(*o <= l.remaining, "{out:?} gives more than {loads:?} needs");
        }
        out
    }

    #[test]
    fn decodes_come_first_then_prefill_fills_the_rest() {
        assert_eq!(run(512, 512, &[dec(), pre(4000), dec()]), [1, 510, 1]);
    }

    #[test]
    fn a_short_prompt_is_not_blocked_by_a_long_one() {
        // The long prompt arrived first, the short one right after.
        assert_eq!(run(512, 512, &[dec(), pre(4000), pre(16)]), [1, 495, 16]);
        // Two long and two short prompts: the short ones finish at once,
        // the oldest gets its quarter, the shorter long one the rest.
        assert_eq!(run(512, 512, &[pre(4000), pre(10), pre(3000), pre(7)]), [128, 10, 367, 7]);
        // With a cap, the step beside the short prompts is a short one.
        assert_eq!(run(512, 128, &[pre(4000), pre(16), pre(16)]), [128, 16, 16]);
    }

    #[test]
    fn the_prefill_cap_holds_each_prompt_while_something_decodes_or_short_and_long_prompts_mix() {
        assert_eq!(run(512, 256, &[dec(), pre(4000)]), [1, 256]);
        assert_eq!(run(512, 256, &[pre(4000)]), [512]);
        assert_eq!(run(512, 256, &[pre(4000), pre(3000)]), [128, 384]);
        assert_eq!(run(512, 128, &[pre(128); 8])[..5], [128, 128, 128, 128, 0]);
        assert_eq!(run(512, 128, &[pre(4000), pre(100)]), [128, 100]);
        // Streams decoding and a burst of prompts: the burst fills the budget.
        assert_eq!(
            run(512, 128, &[dec(), dec(), pre(128), pre(128), pre(128), pre(128), pre(128)]),
            [1, 1, 128, 128, 128, 126, 0]
        );
        // A long prompt beside streams takes its cap, no more.
        assert_eq!(run(512, 128, &[dec(), pre(4000), dec()]), [1, 128, 1]);
    }

    #[test]
    fn prompts_arriving_together_are_served_one_after_another() {
        // Sixteen equal prompts: four finish in this step, not all sixteen
        // in the fourth.
        assert_eq!(run(512, 512, &[pre(128); 16])[..5], [128, 128, 128, 128, 0]);
        assert_eq!(run(3, 3, &[pre(5), pre(5), pre(5), pre(5)]), [3, 0, 0, 0]);
        // Even a budget of one token cannot starve the oldest prompt.
        assert_eq!(run(4, 1, &[pre(900), dec(), pre(2), dec(), dec()]), [1, 1, 0, 1, 1]);
        // Decodes beyond the budget wait for the next step, oldest first.
        assert_eq!(run(2, 2, &[dec(), dec(), dec()]), [1, 1, 0]);
    }

    #[test]
    fn everything_fits_when_the_budget_allows() {
        assert_eq!(run(512, 512, &[pre(100), dec(), pre(200)]), [100, 1, 200]);
        assert_eq!(run(512, 512, &[]), Vec::<usize>::new());
        assert_eq!(run(512, 512, &[pre(0), Load { remaining: 0, decoding: true }]), [0, 0]);
    }

    #[test]
    fn random_loads_use_the_budget_shortest_first_without_starving_the_oldest() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = |m: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % m as u64) as usize
        };
        for _ in 0..2000 {
            let n = next(8) + 1;
            let loads: Vec<Load> = (0..n).map(|_| if next(3) == 0 { dec() } else { pre(next(700) + 1) }).collect();
            let budget = next(600) + 1;
            let cap = if next(2) == 0 { budget } else { next(budget) + 1 };
            let out = run(budget, cap, &loads);
            let decodes = loads.iter().filter(|l| l.decoding).count();
            let for_decode = decodes.min(budget);
            let prompts = || loads.iter().filter(|l| !l.decoding && l.remaining > 0);
            let mixed = prompts().any(|l| l.remaining <= cap) && prompts().any(|l| l.remaining > cap);
            let protect = decodes > 0 || mixed;
            let for_prefill = budget - for_decode;
            // Each prompt's share: its cap while there is something to protect.
            let share = |l: &Load| if protect { l.remaining.min(cap) } else { l.remaining };
            let prefill_work: usize = prompts().map(share).sum();
            for (o, l) in out.iter().zip(&loads) {
                assert!(l.decoding || *o <= share(l), "{loads:?} {budget} {cap} {out:?}");
            }
            let got: usize = out.iter().zip(&loads).filter(|(_, l)| !l.decoding).map(|(o, _)| o).sum();
            // The budget is used up whenever the work exceeds it.
            assert_eq!(got, prefill_work.min(for_prefill), "{loads:?} {budget} {cap} {out:?}");
            let prefills: Vec<usize> = (0..n).filter(|&i| !loads[i].decoding).collect();
            if let Some(&oldest) = prefills.first() {
                // The oldest prompt gets at least its quarter.
                let floor =
                    loads[oldest].remaining.min(for_prefill.div_ceil(4)).min(if protect { cap } else { usize::MAX });
                assert!(out[oldest] >= floor, "{loads:?} {out:?}");
                // Shortest first: a prompt that got anything beyond its floor
                // comes after every prompt needing fewer tokens (older among
                // equals), which therefore got all they needed.
                let base = |i: usize| if i == oldest { floor } else { 0 };
                let need = |i: usize| (loads[i].remaining - base(i), i);
                for &i in &prefills {
                    if out[i] > base(i) {
                        for &j in &prefills {
                            if need(j) < need(i) {
                                assert_eq!(out[j], share(&loads[j]), "{loads:?} {budget} {cap} {out:?}");
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_victim_is_the_lowest_priority_most_recently_admitted() {
        let c = |priority, admitted| Candidate { priority, admitted };
        assert_eq!(victim(&[c(0, 1), c(0, 5), c(0, 3)]), Some(1));
        assert_eq!(victim(&[c(1, 9), c(0, 2), c(0, 1), c(2, 10)]), Some(1));
        assert_eq!(victim(&[]), None);
    }
}
