//! KVF: fragmentation of a KV block pool or memory arena.
//!
//! KVF = total free / largest free extent (>= 1; 1 when all free space is one
//! extent; a full pool is 1 with `full` set). External fragmentation = 1 - 1/KVF.

use crate::{invalid, SignalError};

/// KVF above this is alerted on (DESIGN.md).
pub const KVF_ALERT_THRESHOLD: f64 = 1.8;

/// Fragmentation of one pool, layer or arena.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fragmentation {
    /// total free / largest free extent, >= 1.
    pub kv_fragmentation: f64,
    /// 1 - 1/KVF = 1 - largest / total, in [0, 1).
    pub external_fragmentation: f64,
    /// Free units (blocks or bytes) in all extents.
    pub total_free: u64,
    /// Free units in the largest extent.
    pub largest_free_extent: u64,
    /// Number of free extents.
    pub free_extents: usize,
    /// No free space at all.
    pub full: bool,
}

impl Fragmentation {
    fn from_totals(total_free: u64, largest: u64, extents: usize) -> Self {
        if total_free == 0 {
            return Self {
                kv_fragmentation: 1.0,
                external_fragmentation: 0.0,
                total_free: 0,
                largest_free_extent: 0,
                free_extents: 0,
                full: true,
            };
        }
        let kv_fragmentation = total_free as f64 / largest as f64;
        Self {
            kv_fragmentation,
            external_fragmentation: 1.0 - largest as f64 / total_free as f64,
            total_free,
            largest_free_extent: largest,
            free_extents: extents,
            full: false,
        }
    }

    /// Whether KVF is above the alert threshold.
    pub fn is_alerting(&self) -> bool {
        self.kv_fragmentation > KVF_ALERT_THRESHOLD
    }
}

/// Fragmentation from the sizes of the free extents (zero-size extents are ignored).
pub fn fragmentation_from_extents<I: IntoIterator<Item = u64>>(extents: I) -> Fragmentation {
    let (mut total, mut largest, mut count) = (0u64, 0u64, 0usize);
    for e in extents.into_iter().filter(|&e| e > 0) {
        total = total.saturating_add(e);
        largest = largest.max(e);
        count += 1;
    }
    Fragmentation::from_totals(total, largest, count)
}

/// Fragmentation of a block pool from per-block occupancy (`true` = in use), in blocks.
pub fn fragmentation_from_occupancy(occupied: &[bool]) -> Fragmentation {
    let mut runs = Vec::new();
    let mut run = 0u64;
    for &used in occupied {
        if used {
            runs.push(run);
            run = 0;
        } else {
            run += 1;
        }
    }
    runs.push(run);
    fragmentation_from_extents(runs)
}

/// Fragmentation from a bit-packed occupancy map: bit `i % 64` of `words[i / 64]` set = block `i` in use.
pub fn fragmentation_from_bitmap(words: &[u64], blocks: usize) -> Result<Fragmentation, SignalError> {
    if blocks > words.len() * 64 {
        return Err(invalid(
            "blocks",
            blocks,
            format!("the bitmap has only {} words = {} blocks", words.len(), words.len() * 64),
        ));
    }
    let (mut total, mut largest, mut extents, mut run) = (0u64, 0u64, 0usize, 0u64);
    let mut close_run = |run: &mut u64| {
        if *run > 0 {
            total += *run;
            largest = largest.max(*run);
            extents += 1;
            *run = 0;
        }
    };
    let mut block = 0usize;
    for &word in words {
        if block >= blocks {
            break;
        }
        let valid = (blocks - block).min(64);
        // Whole-word fast paths: an all-free word extends the run, an all-used one closes it.
        let mask = if valid == 64 { u64::MAX } else { (1u64 << valid) - 1 };
        if word & mask == 0 {
            run += valid as u64;
        } else if word & mask == mask {
            close_run(&mut run);
        } else {
            // Word at a time: skip the free bits (trailing zeros), then the used ones (trailing ones).
            let valid_bits = valid as u32;
            let mut pos = 0u32;
            while pos < valid_bits {
                let free = (word >> pos).trailing_zeros().min(valid_bits - pos);
                run += u64::from(free);
                pos += free;
                if pos >= valid_bits {
                    break;
                }
                close_run(&mut run);
                pos += (word >> pos).trailing_ones().min(valid_bits - pos);
            }
        }
        block += valid;
    }
    close_run(&mut run);
    Ok(Fragmentation::from_totals(total, largest, extents))
}

/// Blocks a request of `tokens` tokens needs at `block_tokens` tokens per block.
pub fn blocks_needed(tokens: u64, block_tokens: u64) -> u64 {
    tokens.div_ceil(block_tokens)
}

/// Result of the paged "can these requests get their blocks" check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockPlan {
    /// Blocks each request needs, in request order.
    pub blocks_per_request: Vec<u64>,
    /// Sum of `blocks_per_request`.
    pub blocks_needed: u64,
    /// Free blocks before the requests.
    pub free_blocks: u64,
    /// All requests fit.
    pub fits: bool,
    /// Free blocks left if they fit, else 0.
    pub blocks_left: u64,
    /// Blocks missing if they do not fit, else 0.
    pub shortfall: u64,
}

/// Whether requests fit a paged KV pool: blocks need not be contiguous, so they fit
/// when sum(ceil(tokens / block_tokens)) <= free blocks.
pub fn plan_paged_blocks(
    free_blocks: u64,
    block_tokens: u64,
    request_tokens: &[u64],
) -> Result<BlockPlan, SignalError> {
    if block_tokens == 0 {
        return Err(invalid("block_tokens", 0, "a block must hold at least one token"));
    }
    let blocks_per_request: Vec<u64> =
        request_tokens.iter().map(|&t| blocks_needed(t, block_tokens)).collect();
    let needed = blocks_per_request.iter().fold(0u64, |a, &b| a.saturating_add(b));
    let fits = needed <= free_blocks;
    Ok(BlockPlan {
        blocks_per_request,
        blocks_needed: needed,
        free_blocks,
        fits,
        blocks_left: if fits { free_blocks - needed } else { 0 },
        shortfall: if fits { 0 } else { needed - free_blocks },
    })
}

/// First-fit placement into contiguous free extents (an arena allocator):
/// the index of the extent each request lands in, or `None` when none is large enough.
pub fn first_fit_contiguous(extents: &[u64], sizes: &[u64]) -> Vec<Option<usize>> {
    let mut remaining = extents.to_vec();
    sizes
        .iter()
        .map(|&size| {
            let slot = remaining.iter().position(|&free| free >= size && size > 0);
            if let Some(i) = slot {
                remaining[i] -= size;
            }
            slot
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn design_example_all_requests_fit() {
        // 128 free blocks; 120/40/20 tokens at 16 per block need 8 + 3 + 2 = 13 blocks.
        let plan = plan_paged_blocks(128, 16, &[120, 40, 20]).unwrap();
        assert_eq!(plan.blocks_per_request, vec![8, 3, 2]);
        assert_eq!(plan.blocks_needed, 13);
        assert!(plan.fits);
        assert_eq!(plan.blocks_left, 115);
        assert_eq!(plan.shortfall, 0);
    }

    #[test]
    fn shortfall_is_reported() {
        let plan = plan_paged_blocks(10, 16, &[120, 40, 20]).unwrap();
        assert!(!plan.fits);
        assert_eq!(plan.shortfall, 3);
        assert!(plan_paged_blocks(10, 0, &[1]).is_err());
    }

    #[test]
    fn contiguous_free_space_is_one() {
        let f = fragmentation_from_occupancy(&[true, true, false, false, false, true]);
        assert_eq!(f.kv_fragmentation, 1.0);
        assert_eq!(f.external_fragmentation, 0.0);
        assert!(!f.full);
    }

    #[test]
    fn full_pool() {
        let f = fragmentation_from_occupancy(&[true; 8]);
        assert!(f.full);
        assert_eq!(f.kv_fragmentation, 1.0);
        assert!(fragmentation_from_extents([]).full);
    }

    #[test]
    fn checkerboard_is_fragmented() {
        let occ: Vec<bool> = (0..100).map(|i| i % 2 == 0).collect();
        let f = fragmentation_from_occupancy(&occ);
        assert_eq!(f.kv_fragmentation, 50.0);
        assert!(f.is_alerting());
        assert!((f.external_fragmentation - 0.98).abs() < 1e-12);
    }

    #[test]
    fn first_fit_places_in_order() {
        assert_eq!(
            first_fit_contiguous(&[10, 30, 5], &[20, 8, 8, 40]),
            vec![Some(1), Some(0), Some(1), None]
        );
    }

    #[test]
    fn bitmap_length_is_checked() {
        assert!(fragmentation_from_bitmap(&[0], 65).is_err());
    }

    /// The simple per-bit scan the word-at-a-time one must agree with.
    fn per_bit(words: &[u64], blocks: usize) -> Fragmentation {
        let occ: Vec<bool> = (0..blocks).map(|i| words[i / 64] >> (i % 64) & 1 == 1).collect();
        fragmentation_from_occupancy(&occ)
    }

    proptest! {
        #[test]
        fn word_scan_equals_per_bit(words in prop::collection::vec(any::<u64>(), 0..12), cut in 0usize..64, sparse in any::<bool>()) {
            let words: Vec<u64> = if sparse { words.iter().map(|w| w & w.rotate_left(7) & w.rotate_left(19)).collect() } else { words };
            let blocks = (words.len() * 64).saturating_sub(cut);
            prop_assert_eq!(fragmentation_from_bitmap(&words, blocks).unwrap(), per_bit(&words, blocks));
        }

        #[test]
        fn kvf_at_least_one(extents in prop::collection::vec(0u64..10_000, 0..50)) {
            let f = fragmentation_from_extents(extents.iter().copied());
            prop_assert!(f.kv_fragmentation >= 1.0);
            prop_assert!((0.0..1.0).contains(&f.external_fragmentation));
            prop_assert!((f.external_fragmentation - (1.0 - 1.0 / f.kv_fragmentation)).abs() < 1e-12);
        }

        #[test]
        fn bitmap_equals_bool_map(occ in prop::collection::vec(any::<bool>(), 0..700), dense in any::<bool>()) {
            let occ: Vec<bool> = if dense { occ.iter().map(|&b| b && occ.len() % 3 == 0).collect() } else { occ };
            let mut words = vec![0u64; occ.len().div_ceil(64)];
            for (i, &u) in occ.iter().enumerate() {
                if u { words[i / 64] |= 1 << (i % 64); }
            }
            prop_assert_eq!(fragmentation_from_bitmap(&words, occ.len()).unwrap(), fragmentation_from_occupancy(&occ));
        }

        #[test]
        fn paged_plan_matches_sum(free in 0u64..1000, bt in 1u64..64, reqs in prop::collection::vec(0u64..4096, 0..20)) {
            let plan = plan_paged_blocks(free, bt, &reqs).unwrap();
            let needed: u64 = reqs.iter().map(|t| t / bt + u64::from(t % bt != 0)).sum();
            prop_assert_eq!(plan.blocks_needed, needed);
            prop_assert_eq!(plan.fits, needed <= free);
        }
    }
}
