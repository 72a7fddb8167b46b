//! Static act-order: the column permutation by descending `diag(H)`, and applying it to the
//! Hessian (rows and columns) and the weight (columns).
//!
//! llm-compressor (`helpers.py::apply_activation_ordering`) and Quark both take
//! `torch.argsort(diag(H), descending=True)`, which is not stable; here ties keep their index
//! order. A tie between live columns is the only place the two can differ (dead columns, all
//! zero, tie at 0 and are decoupled from everything, so their order changes nothing).

/// `perm[i]` = the original column processed `i`-th: descending `diag(i)`, ties by index.
pub fn descending_diag(n: usize, diag: impl Fn(usize) -> f64) -> Vec<usize> {
    let d: Vec<f64> = (0..n).map(diag).collect();
    let mut perm: Vec<usize> = (0..n).collect();
    perm.sort_by(|&a, &b| d[b].total_cmp(&d[a]));
    perm
}

/// `perm` inverted: `inv[perm[i]] = i`.
pub fn inverse(perm: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    inv
}

/// In place: `H ← H[perm][:, perm]` for a row-major `[n, n]` matrix, one extra row of memory
/// (columns gathered row by row, then rows moved along the permutation's cycles).
pub fn permute_square<T: Copy + Default>(h: &mut [T], n: usize, perm: &[usize]) {
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return;
    }
    let mut tmp = vec![T::default(); n];
    for row in h.chunks_exact_mut(n) {
        for (t, &p) in tmp.iter_mut().zip(perm) {
            *t = row[p];
        }
        row.copy_from_slice(&tmp);
    }
    let mut done = vec![false; n];
    for start in 0..n {
        if done[start] {
            continue;
        }
        // new row i = old row perm[i]: walk i → perm[i] until back at start.
        tmp.copy_from_slice(&h[start * n..(start + 1) * n]);
        let mut i = start;
        loop {
            done[i] = true;
            let src = perm[i];
            if src == start {
                h[i * n..(i + 1) * n].copy_from_slice(&tmp);
                break;
            }
            h.copy_within(src * n..(src + 1) * n, i * n);
            i = src;
        }
    }
}

/// `W[:, perm]` of a row-major `[rows, cols]` matrix, as a new f32 buffer.
pub fn permute_columns(w: &[f32], rows: usize, cols: usize, perm: &[usize]) -> Vec<f32> {
    let mut out = vec![0f32; rows * cols];
    for (o, r) in out.chunks_exact_mut(cols).zip(w.chunks_exact(cols)) {
        for (x, &p) in o.iter_mut().zip(perm) {
            *x = r[p];
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sorts_descending_with_stable_ties() {
        let d = [1.0, 3.0, 0.0, 3.0, 2.0, 0.0];
        assert_eq!(descending_diag(6, |i| d[i]), vec![1, 3, 4, 0, 2, 5]);
        assert_eq!(inverse(&[1, 3, 4, 0, 2, 5]), vec![3, 0, 4, 1, 2, 5]);
    }

    /// The in-place permutation equals the gathered copy, for a permutation with several
    /// cycles, a fixed point and a 2-cycle.
    #[test]
    fn permute_square_matches_gather() {
        let n = 7;
        let perm = [3, 0, 1, 2, 4, 6, 5];
        let h: Vec<u32> = (0..(n * n) as u32).collect();
        let mut got = h.clone();
        permute_square(&mut got, n, &perm);
        for i in 0..n {
            for j in 0..n {
                assert_eq!(got[i * n + j], h[perm[i] * n + perm[j]], "({i},{j})");
            }
        }
        let w: Vec<f32> = (0..2 * n).map(|v| v as f32).collect();
        let p = permute_columns(&w, 2, n, &perm);
        assert_eq!(p[n + 1], w[n + perm[1]]);
    }
}
