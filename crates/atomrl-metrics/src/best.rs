//! [`final_and_best`]: what a run's comparison reports of a metric.

/// Whether smaller values of `metric` are better (losses and KL).
///
/// ```
/// use atomrl_metrics::lower_is_better;
/// assert!(lower_is_better("eval/loss") && lower_is_better("kl"));
/// assert!(!lower_is_better("eval/accuracy"));
/// ```
pub fn lower_is_better(metric: &str) -> bool {
    metric.contains("loss") || metric == "kl"
}

/// The last value of a metric's `(step, value)` points and its best one (the largest, or the
/// smallest where [`lower_is_better`]) with its step (the first step it was reached); `None`
/// without points. Non-finite values are skipped.
///
/// ```
/// use atomrl_metrics::final_and_best;
/// let points = [(1, 0.2), (2, 0.6), (3, f64::NAN), (4, 0.5)];
/// assert_eq!(final_and_best(&points, "eval/accuracy"), Some((0.5, (0.6, 2))));
/// assert_eq!(final_and_best(&points, "loss"), Some((0.5, (0.2, 1))));
/// assert_eq!(final_and_best(&[], "loss"), None);
/// ```
pub fn final_and_best(points: &[(u64, f64)], metric: &str) -> Option<(f64, (f64, u64))> {
    let lower = lower_is_better(metric);
    let mut finite = points.iter().filter(|(_, v)| v.is_finite());
    let first = *finite.next()?;
    let (mut last, mut best) = (first.1, first);
    for &(step, v) in finite {
        last = v;
        if (lower && v < best.1) || (!lower && v > best.1) {
            best = (step, v);
        }
    }
    Some((last, (best.1, best.0)))
}
