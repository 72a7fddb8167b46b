//! The prompt-lookup (n-gram) drafter, as vLLM's `ngram` method and the "prompt lookup
//! decoding" papers define it: find the most recent earlier occurrence of the last n tokens of
//! the context (n from `max_n` down to `min_n`) and propose the tokens that followed it. A
//! training-free baseline: a trained draft that does not beat it is not worth shipping.

/// Proposals of up to `k` tokens for the context `ctx` (prompt + committed tokens).
pub fn propose(ctx: &[u32], k: usize, min_n: usize, max_n: usize) -> Vec<u32> {
    let len = ctx.len();
    for n in (min_n.max(1)..=max_n).rev() {
        if n >= len {
            continue;
        }
        let pat = &ctx[len - n..];
        // Latest earlier start `s` with ctx[s..s+n] == pat and at least one token after it.
        for s in (0..len - n).rev() {
            if &ctx[s..s + n] == pat {
                let from = s + n;
                return ctx[from..(from + k).min(len)].to_vec();
            }
        }
    }
    Vec::new()
}

/// Depth matches of the n-gram drafter over a sequence (for [`super::walk::walk`]).
pub fn matches(x: &[u32], prompt_len: usize, k: usize) -> super::walk::Matches {
    super::walk::matches_from_proposals(x, prompt_len, k, |t| propose(&x[..t + 2], k, 1, 3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_latest_longest_match() {
        // ... 1 2 3 9 ... 1 2 3 7 8 ... then context ends in 2 3 → latest match is "2 3 7 8".
        let ctx = [1, 2, 3, 9, 5, 1, 2, 3, 7, 8, 6, 2, 3];
        assert_eq!(propose(&ctx, 3, 1, 3), vec![7, 8, 6]);
        assert_eq!(propose(&[4, 5, 6], 3, 1, 3), Vec::<u32>::new());
        assert_eq!(propose(&[4, 5, 4], 2, 1, 3), vec![5, 4]);
    }

    #[test]
    fn repetitive_text_is_easy_for_it() {
        let x: Vec<u32> = (0..60).map(|i| (i % 5) as u32).collect();
        let w = super::super::walk::walk(&matches(&x, 10, 3));
        assert!(w.al_walk() > 3.5);
    }
}
