//! The engine's policy, as pure functions of counts: how a step's token
//! budget is shared, and whom to preempt. No FFI, no model: the unit tests
//! below check fairness and preemption order in microseconds.

/// What the planner knows about one admitted sequence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Load {
    /// Tokens that still have to go through the model before the next
    /// sample: 1 for a decoding sequence, the uncached part of the prompt
    /// for a prefilling one.
    pub remaining: usize,
    /// Generating (one token per step) rather than prefilling.
    pub decoding: bool,
}

/// Shares one step's budget of `budget` tokens: every decoding sequence
/// gets its one token first (the oldest first, should there be more of
/// them than the budget), then the prefilling sequences share what is
/// left, capped at `prefill_cap` while any sequence decodes, by
/// water-filling: each gets an equal share, a sequence needing less than
/// its share gives the rest to the others, and any remainder goes to the
/// oldest. A short prompt therefore finishes its prefill in the step it
/// arrives in even while a long one is prefilling, and a running stream
/// waits for at most one step of `budget` tokens.
///
/// `out[i]` receives the tokens of `loads[i]` in this step (0: none).
pub(crate) fn plan(budget: usize, prefill_cap: usize, loads: &[Load], out: &mut Vec<usize>) {
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
    if decoding {
        left = left.min(prefill_cap);
    }
    // Water-filling: repeatedly give every unsatisfied prefill an equal
    // share; those needing no more than the share are settled.
    let mut open: Vec<usize> = (0..loads.len()).filter(|&i| !loads[i].decoding && loads[i].remaining > 0).collect();
    while left > 0 && !open.is_empty() {
        let share = left / open.len();
        if share == 0 {
            // Fewer tokens than sequences: one each to the oldest.
            for &i in open.iter().take(left) {
                out[i] += 1;
            }
            break;
        }
        let mut settled = false;
        open.retain(|&i| {
            let need = loads[i].remaining - out[i];
            if need <= share {
                out[i] += need;
                left -= need;
                settled = true;
                false
            } else {
                true
            }
        });
        if !settled {
            // Every open sequence needs more than its share: give each the
            // share and the remainder to the oldest.
            let extra = left - share * open.len();
            for (n, &i) in open.iter().enumerate() {
                out[i] += share + usize::from(n < extra);
            }
            break;
        }
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
        plan(budget, cap, loads, &mut out);
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
        // the long ones split the rest evenly (remainder to the oldest).
        assert_eq!(run(512, 512, &[pre(4000), pre(10), pre(3000), pre(7)]), [248, 10, 247, 7]);
    }

    #[test]
    fn the_prefill_cap_applies_only_while_something_decodes() {
        assert_eq!(run(512, 256, &[dec(), pre(4000)]), [1, 256]);
        assert_eq!(run(512, 256, &[pre(4000)]), [512]);
    }

    #[test]
    fn more_prefills_than_tokens_serve_the_oldest() {
        assert_eq!(run(3, 3, &[pre(5), pre(5), pre(5), pre(5)]), [1, 1, 1, 0]);
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
    fn water_filling_is_fair_for_random_loads() {
        // For any loads: the budget is used up whenever the work exceeds
        // it, and no prefill gets more than another unless the other
        // needed less (max-min fairness).
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
            let out = run(budget, budget, &loads);
            let work: usize = loads.iter().map(|l| l.remaining).sum();
            assert_eq!(out.iter().sum::<usize>(), work.min(budget), "{loads:?} {budget} {out:?}");
            for i in 0..n {
                for j in 0..n {
                    if !loads[i].decoding && !loads[j].decoding && out[i] < loads[i].remaining {
                        assert!(out[j] <= out[i] + 1, "unfair: {loads:?} {budget} {out:?}");
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
