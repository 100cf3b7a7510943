//! [`min_max_downsample`]: a long curve cut to a few points per pixel column for the browser.

/// `(xs, ys)` (same length, `xs` increasing) reduced to at most `max_points` points: the
/// first and last points, and in each of `max_points / 2 - 1` equal buckets between them the
/// smallest and largest `y` in `x` order. Unlike averaging or LTTB it keeps every spike (a
/// loss blow-up, a reward collapse) whatever the zoom, which is what a training curve is read
/// for; 8 lines by hand rather than a dependency. Curves with at most `max_points` points (and
/// `max_points < 4`) are returned whole.
///
/// ```
/// use atomrl_dashboard::min_max_downsample;
/// let xs: Vec<f64> = (0..10_000).map(f64::from).collect();
/// let mut ys = vec![0.0; 10_000];
/// ys[5_000] = 9.0; // a spike
/// let (dx, dy) = min_max_downsample(&xs, &ys, 100);
/// assert!(dx.len() <= 100 && dx.len() == dy.len());
/// assert!(dy.contains(&9.0));
/// assert_eq!((dx[0], *dx.last().unwrap()), (0.0, 9_999.0));
/// assert!(dx.windows(2).all(|w| w[0] < w[1]));
/// ```
pub fn min_max_downsample(xs: &[f64], ys: &[f64], max_points: usize) -> (Vec<f64>, Vec<f64>) {
    let n = xs.len().min(ys.len());
    if n <= max_points || max_points < 4 {
        return (xs[..n].to_vec(), ys[..n].to_vec());
    }
    let buckets = max_points / 2 - 1;
    let inner = n - 2;
    let mut keep = Vec::with_capacity(max_points);
    keep.push(0);
    for b in 0..buckets {
        let lo = 1 + b * inner / buckets;
        let hi = 1 + (b + 1) * inner / buckets;
        if lo >= hi {
            continue;
        }
        let by_y = |a: &usize, b: &usize| ys[*a].total_cmp(&ys[*b]);
        let min = (lo..hi).min_by(by_y).unwrap_or(lo);
        let max = (lo..hi).max_by(by_y).unwrap_or(lo);
        keep.push(min.min(max));
        if min != max {
            keep.push(min.max(max));
        }
    }
    keep.push(n - 1);
    (
        keep.iter().map(|&i| xs[i]).collect(),
        keep.iter().map(|&i| ys[i]).collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Bounded size, x order kept, the extremes and end points kept.
        #[test]
        fn keeps_bounds_order_and_extremes(
            ys in proptest::collection::vec(-1e6f64..1e6, 1..3_000),
            max_points in 4usize..400,
        ) {
            let xs: Vec<f64> = (0..ys.len()).map(|i| i as f64).collect();
            let (dx, dy) = min_max_downsample(&xs, &ys, max_points);
            prop_assert!(dx.len() <= max_points.max(ys.len().min(max_points)));
            prop_assert!(dx.windows(2).all(|w| w[0] < w[1]));
            prop_assert_eq!(dx[0], 0.0);
            prop_assert_eq!(*dx.last().unwrap(), (ys.len() - 1) as f64);
            let max = ys.iter().copied().fold(f64::MIN, f64::max);
            let min = ys.iter().copied().fold(f64::MAX, f64::min);
            prop_assert!(dy.contains(&max) && dy.contains(&min));
        }
    }
}
