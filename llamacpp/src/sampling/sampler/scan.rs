//! The vectorised scans behind the greedy and top-k shortcuts: they pick
//! exactly what llama.cpp's sequential samplers pick, without building
//! the full candidate array.

fn sift_down(heap: &mut [(f32, i32)], less: impl Fn(&(f32, i32), &(f32, i32)) -> bool) {
    let mut i = 0;
    loop {
        let (l, r) = (2 * i + 1, 2 * i + 2);
        let mut smallest = i;
        if l < heap.len() && less(&heap[l], &heap[smallest]) {
            smallest = l;
        }
        if r < heap.len() && less(&heap[r], &heap[smallest]) {
            smallest = r;
        }
        if smallest == i {
            return;
        }
        heap.swap(i, smallest);
        i = smallest;
    }
}

/// Lanes of the vectorised scans below: one AVX-512 register, two AVX2 ones.
const LANES: usize = 16;

/// The index of the first largest value, exactly as llama.cpp's greedy
/// sampler picks it (a sequential scan with `>`: NaN is skipped unless it
/// stands first). One pass, vectorised: each lane keeps the first index of
/// its own maximum, and the lanes are merged by value, then by index.
pub(super) fn argmax(values: &[f32]) -> usize {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU supports AVX-512F (checked at run time, cached by std).
        return unsafe { argmax_avx512(values) };
    }
    argmax_generic(values)
}

/// [`argmax_generic`] compiled for AVX-512, where the compiler vectorises
/// the value-and-index selection (measured: 15 µs instead of 63-70 µs for
/// a 262,144-entry row; AVX2 alone gains little, so it is not worth a path).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn argmax_avx512(values: &[f32]) -> usize {
    argmax_generic(values)
}

#[inline(always)]
fn argmax_generic(values: &[f32]) -> usize {
    if values.first().is_some_and(|v| v.is_nan()) {
        return 0;
    }
    let chunks = values.chunks_exact(LANES);
    let tail_start = values.len() - chunks.remainder().len();
    let mut best = [f32::NEG_INFINITY; LANES];
    let mut best_index = [u32::MAX; LANES];
    for (c, chunk) in chunks.enumerate() {
        let base = (c * LANES) as u32;
        for j in 0..LANES {
            let take = chunk[j] > best[j];
            best[j] = if take { chunk[j] } else { best[j] };
            best_index[j] = if take { base + j as u32 } else { best_index[j] };
        }
    }
    let (mut max, mut index) = (f32::NEG_INFINITY, usize::MAX);
    for j in 0..LANES {
        let i = best_index[j] as usize;
        if best_index[j] != u32::MAX && (best[j] > max || (best[j] == max && i < index)) {
            (max, index) = (best[j], i);
        }
    }
    for (i, &x) in values.iter().enumerate().skip(tail_start) {
        if x > max {
            (max, index) = (x, i);
        }
    }
    if index == usize::MAX {
        // Nothing above -inf: the sequential rule keeps index 0.
        return 0;
    }
    index
}

/// Offers `logits[from..]` to the min-heap of the best values (sorted
/// ascending on entry, so a valid heap). Looks only into chunks whose
/// maximum beats the heap's smallest. Returns false on NaN, whose order in
/// llama.cpp's sort is unspecified (the caller then takes the full path).
pub(super) fn scan_top_k(logits: &[f32], from: usize, heap: &mut [(f32, i32)]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU supports AVX-512F (checked at run time, cached by std).
        return unsafe { scan_top_k_avx512(logits, from, heap) };
    }
    scan_top_k_generic(logits, from, heap)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn scan_top_k_avx512(logits: &[f32], from: usize, heap: &mut [(f32, i32)]) -> bool {
    scan_top_k_generic(logits, from, heap)
}

#[inline(always)]
fn scan_top_k_generic(logits: &[f32], from: usize, heap: &mut [(f32, i32)]) -> bool {
    let less = |a: &(f32, i32), b: &(f32, i32)| a.0 < b.0;
    for (c, chunk) in logits[from..].chunks(LANES).enumerate() {
        let (max, nan) = chunk_max(chunk);
        if nan {
            return false;
        }
        if max <= heap[0].0 {
            continue;
        }
        let base = from + c * LANES;
        for (j, &x) in chunk.iter().enumerate() {
            if x > heap[0].0 {
                heap[0] = (x, (base + j) as i32);
                sift_down(heap, less);
            }
        }
    }
    true
}

/// The largest value of each chunk of [`LANES`] (vectorised), and whether
/// the chunk holds a NaN.
#[inline(always)]
fn chunk_max(chunk: &[f32]) -> (f32, bool) {
    let mut max = f32::NEG_INFINITY;
    let mut nan = false;
    for &x in chunk {
        max = if x > max { x } else { max };
        nan |= x.is_nan();
    }
    (max, nan)
}

#[cfg(test)]
mod tests {
    use super::{LANES, argmax, argmax_generic, scan_top_k, scan_top_k_generic};

    /// A small xorshift generator for the test rows.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }

        /// A row of `len` values: few distinct ones (ties are common) when
        /// `coarse`, else spread floats; with some -inf, +inf and, when
        /// `nan`, NaN.
        fn row(&mut self, len: usize, coarse: bool, nan: bool) -> Vec<f32> {
            (0..len)
                .map(|_| match self.next() % 64 {
                    0 if nan => f32::NAN,
                    1 => f32::NEG_INFINITY,
                    2 if !coarse => f32::INFINITY,
                    r if coarse => (r % 7) as f32 - 3.0,
                    _ => ((self.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 40.0,
                })
                .collect()
        }
    }

    /// The argmax by sorting: indices ordered by descending value (NaN
    /// excluded), stably, so the first of equal maxima comes first; a NaN at
    /// index 0, or no value above -inf, gives 0 (llama.cpp's sequential rule
    /// never leaves index 0 then).
    fn sorted_argmax(values: &[f32]) -> usize {
        if values.first().is_none_or(|v| v.is_nan()) {
            return 0;
        }
        let mut order: Vec<usize> = (0..values.len()).filter(|&i| !values[i].is_nan()).collect();
        order.sort_by(|&a, &b| values[b].partial_cmp(&values[a]).expect("no NaN left"));
        match order.first() {
            Some(&i) if values[i] > f32::NEG_INFINITY => i,
            _ => 0,
        }
    }

    #[test]
    fn argmax_generic_equals_a_sort_based_reference() {
        let mut rng = Rng(0x0dd_ba11_5eed);
        for len in [0usize, 1, 2, LANES - 1, LANES, LANES + 1, 3 * LANES + 5, 257, 4096, 262_144] {
            let rounds = if len > 10_000 { 4 } else { 100 };
            for round in 0..rounds {
                let v = rng.row(len, round % 2 == 0, round % 3 == 0);
                let want = sorted_argmax(&v);
                assert_eq!(argmax_generic(&v), want, "len {len}, round {round}");
                assert_eq!(argmax(&v), want, "len {len}, round {round} (dispatched)");
            }
        }
        // The maximum in the tail after the last full chunk, and ties
        // across lanes, chunks and the tail.
        let mut v = vec![1.0f32; 3 * LANES + 3];
        v[3 * LANES + 1] = 2.0;
        assert_eq!(argmax_generic(&v), 3 * LANES + 1);
        v[LANES + 7] = 2.0;
        assert_eq!(argmax_generic(&v), LANES + 7);
        v[5] = 2.0;
        assert_eq!(argmax_generic(&v), 5);
        assert_eq!(argmax_generic(&[f32::NEG_INFINITY, f32::NAN, 1.0]), 2);
        assert_eq!(argmax_generic(&[f32::NAN, f32::INFINITY]), 0);
    }

    /// A scan: `scan_top_k` or `scan_top_k_generic`.
    type Scan = fn(&[f32], usize, &mut [(f32, i32)]) -> bool;

    /// What `preselect_top_k` does around the scan: the heap starts as the
    /// first `keep` values sorted ascending (a valid min-heap), the scan
    /// offers the rest.
    fn heap_of(values: &[f32], keep: usize, scan: Scan) -> Option<Vec<(f32, i32)>> {
        let filled = keep.min(values.len());
        let mut heap: Vec<(f32, i32)> = values[..filled].iter().enumerate().map(|(i, &x)| (x, i as i32)).collect();
        heap.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
        scan(values, filled, &mut heap).then_some(heap)
    }

    /// Checks a scanned heap against the `keep` best values by a stable
    /// sort: the same values; each entry a real (value, index) pair of the
    /// row, no index twice; every value above the k-th place present by
    /// index (only the indices of values tied at the k-th place are not
    /// determined); and a valid min-heap.
    fn check_heap(values: &[f32], keep: usize, heap: &[(f32, i32)], what: &str) {
        let mut order: Vec<usize> = (0..values.len()).collect();
        order.sort_by(|&a, &b| values[b].total_cmp(&values[a]));
        let best = &order[..keep.min(values.len())];
        let mut got: Vec<f32> = heap.iter().map(|e| e.0).collect();
        got.sort_by(|a, b| b.total_cmp(a));
        let want: Vec<f32> = best.iter().map(|&i| values[i]).collect();
        assert_eq!(got, want, "{what}: the values kept");
        let mut ids: Vec<i32> = heap.iter().map(|e| e.1).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), heap.len(), "{what}: an index twice");
        for &(x, i) in heap {
            assert_eq!(values[i as usize].to_bits(), x.to_bits(), "{what}: entry ({x}, {i})");
        }
        if let Some(&last) = want.last() {
            for &i in best.iter().filter(|&&i| values[i] > last) {
                assert!(heap.iter().any(|e| e.1 == i as i32), "{what}: index {i} ({}) missing", values[i]);
            }
        }
        for (j, e) in heap.iter().enumerate() {
            for child in [2 * j + 1, 2 * j + 2] {
                if let Some(c) = heap.get(child) {
                    assert!(e.0 <= c.0, "{what}: not a min-heap at {j}");
                }
            }
        }
    }

    #[test]
    fn scan_top_k_generic_equals_a_sort_based_reference() {
        let mut rng = Rng(0x7091_c0de);
        for len in [1usize, 2, LANES, LANES + 1, 100, 703, 4096, 262_144] {
            for keep in [1usize, 2, 3, 17, 41, 129, 201, 1001] {
                let rounds = if len > 10_000 { 1 } else { 20 };
                for round in 0..rounds {
                    let what = format!("len {len}, keep {keep}, round {round}");
                    let v = rng.row(len, round % 2 == 0, false);
                    let heap = heap_of(&v, keep, scan_top_k_generic).expect("no NaN");
                    check_heap(&v, keep, &heap, &what);
                    // Distinct values: the indices too are exactly the
                    // sort's.
                    let distinct: Vec<f32> = (0..len).map(|i| (i * 7919 % len) as f32 + 0.5 * (round as f32)).collect();
                    let heap = heap_of(&distinct, keep, scan_top_k_generic).expect("no NaN");
                    let mut ids: Vec<i32> = heap.iter().map(|e| e.1).collect();
                    ids.sort_unstable_by_key(|&i| std::cmp::Reverse(distinct[i as usize].to_bits()));
                    let mut order: Vec<i32> = (0..len as i32).collect();
                    order.sort_by(|&a, &b| distinct[b as usize].total_cmp(&distinct[a as usize]));
                    order.truncate(keep.min(len));
                    assert_eq!(ids, order, "{what}: distinct values");
                    // The dispatched scan (AVX-512 or this one) agrees.
                    assert_eq!(heap_of(&v, keep, scan_top_k), heap_of(&v, keep, scan_top_k_generic), "{what}");
                }
            }
        }
    }

    #[test]
    fn scan_top_k_generic_refuses_nan_after_the_heap() {
        let mut v: Vec<f32> = (0..100).map(|i| i as f32).collect();
        // In a chunk it would skip (its maximum is below the heap's
        // smallest) as well as in one it would look into.
        for at in [10usize, 60, 99] {
            let mut row = v.clone();
            row[at] = f32::NAN;
            assert!(heap_of(&row, 5, scan_top_k_generic).is_none(), "NaN at {at}");
            assert!(heap_of(&row, 5, scan_top_k).is_none(), "NaN at {at} (dispatched)");
        }
        // A NaN inside the first `keep` values is the caller's to check.
        v[2] = f32::NAN;
        let heap = heap_of(&v, 5, scan_top_k_generic).expect("not scanned");
        assert!(heap.iter().any(|e| e.0.is_nan()));
    }

    /// llama.cpp's greedy rule, sequentially.
    fn sequential(values: &[f32]) -> usize {
        let mut selected = 0;
        for i in 1..values.len() {
            if values[i] > values[selected] {
                selected = i;
            }
        }
        selected
    }

    #[test]
    fn argmax_equals_the_sequential_rule() {
        let mut state = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for len in [0usize, 1, 2, 15, 16, 17, 31, 33, 100, 1000] {
            for _ in 0..200 {
                // Few distinct values, so ties are common; some -inf and NaN.
                let v: Vec<f32> = (0..len)
                    .map(|_| match next() % 20 {
                        0 => f32::NAN,
                        1 => f32::NEG_INFINITY,
                        r => (r % 5) as f32,
                    })
                    .collect();
                if v.first().is_some_and(|x| x.is_nan()) {
                    assert_eq!(argmax(&v), 0);
                    continue;
                }
                assert_eq!(argmax(&v), sequential(&v), "{v:?}");
                assert_eq!(argmax_generic(&v), sequential(&v), "{v:?}");
            }
        }
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NAN, f32::NEG_INFINITY]), 0);
    }

    #[test]
    fn argmax_takes_the_first_of_equal_maxima() {
        assert_eq!(argmax(&[1.0, 3.0, 2.0, 3.0]), 1);
        let mut v = vec![0.0f32; 1000];
        v[517] = 5.0;
        v[900] = 5.0;
        assert_eq!(argmax(&v), 517);
        assert_eq!(argmax(&[f32::NEG_INFINITY; 3]), 0);
        assert_eq!(argmax(&[]), 0);
    }

    #[test]
    fn argmax_treats_nan_like_llama_cpp() {
        assert_eq!(argmax(&[f32::NAN, 1.0, 2.0]), 0);
        assert_eq!(argmax(&[0.5, f32::NAN, 2.0, f32::NAN]), 2);
        let mut v = vec![1.0f32; 20];
        v[3] = f32::NAN;
        v[17] = 4.0;
        assert_eq!(argmax(&v), 17);
        assert_eq!(argmax(&[f32::NAN; 9]), 0);
    }
}
