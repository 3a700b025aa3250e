//! The RFC 9162 §2.1.1 Merkle tree hash shape, over leaf hashes the caller computed: a tree of
//! `n > 1` leaves splits at the largest power of two below `n`, no padding. The hash function is
//! the caller's (`node(left, right)`, e.g. SHA-256(0x01 ‖ left ‖ right)), so every user keeps its
//! own leaf and node domain separation and this crate needs no digest library.

/// The largest power of two strictly below `n` (`n ≥ 2`; 1 otherwise).
pub fn split(n: usize) -> usize {
    let mut k = 1;
    while k << 1 < n {
        k <<= 1;
    }
    k
}

/// MTH over `leaves` (`None` for no leaf: what an empty tree hashes to is the caller's choice).
pub fn tree_root<H: Copy>(leaves: &[H], node: &impl Fn(&H, &H) -> H) -> Option<H> {
    match leaves {
        [] => None,
        [leaf] => Some(*leaf),
        _ => {
            let k = split(leaves.len());
            Some(node(&tree_root(&leaves[..k], node)?, &tree_root(&leaves[k..], node)?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With string concatenation as the "hash", the tree's shape is visible.
    #[test]
    fn the_tree_splits_at_the_largest_power_of_two_below_n() {
        let leaves = ["a", "b", "c", "d", "e", "f", "g"];
        let node = |left: &&'static str, right: &&'static str| -> &'static str {
            Box::leak(format!("({left}{right})").into_boxed_str())
        };
        assert_eq!(tree_root(&leaves, &node), Some("(((ab)(cd))((ef)g))"));
        assert_eq!(tree_root(&leaves[..5], &node), Some("(((ab)(cd))e)"));
        assert_eq!(tree_root(&leaves[..1], &node), Some("a"));
        assert_eq!(tree_root::<&str>(&[], &node), None);
        assert_eq!((split(2), split(3), split(4), split(5), split(8), split(9)), (1, 2, 2, 4, 4, 8));
    }
}
