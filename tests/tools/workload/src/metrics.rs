//! Reading Prometheus text exposition in tests, benches and the demo.

/// `name{a="x",b="y"}` → (`name`, [(`a`, `x`), (`b`, `y`)]). Label values
/// here come from fixed sets without commas or quotes.
pub fn parse_series(series: &str) -> (&str, Vec<(&str, &str)>) {
    let Some((name, rest)) = series.split_once('{') else {
        return (series, Vec::new());
    };
    let labels = rest
        .trim_end_matches('}')
        .split(',')
        .filter(|pair| !pair.is_empty())
        .filter_map(|pair| pair.split_once('='))
        .map(|(key, value)| (key, value.trim_matches('"')))
        .collect();
    (name, labels)
}

/// The sum of every sample of metric `name` whose labels include those of
/// `series` (`name{label="value",...}`, or just `name` for all its samples);
/// `None` when no sample matches. So `x_total{reason="r"}` adds up the
/// series of every controller.
pub fn sample_sum(text: &str, series: &str) -> Option<f64> {
    let (name, wanted) = parse_series(series);
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|line| {
            let (sample, value) = line.rsplit_once(' ')?;
            let (sample_name, labels) = parse_series(sample);
            let matches = sample_name == name && wanted.iter().all(|w| labels.contains(w));
            matches.then(|| value.parse::<f64>().ok()).flatten()
        })
        .fold(None, |sum, v| Some(sum.unwrap_or(0.0) + v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_subsets_add_up_and_names_must_match() {
        let text = "# HELP x_total x\n\
                    x_total{controller=\"endpoints\",reason=\"a\"} 1\n\
                    x_total{controller=\"endpointslices\",reason=\"a\"} 2\n\
                    x_total{controller=\"endpoints\",reason=\"b\"} 4\n\
                    x_total_other 8\n\
                    y 16\n";
        assert_eq!(sample_sum(text, "x_total{reason=\"a\"}"), Some(3.0));
        assert_eq!(
            sample_sum(text, "x_total{controller=\"endpoints\",reason=\"a\"}"),
            Some(1.0)
        );
        assert_eq!(sample_sum(text, "x_total"), Some(7.0));
        assert_eq!(sample_sum(text, "y"), Some(16.0));
        assert_eq!(sample_sum(text, "x_total{reason=\"c\"}"), None);
        assert_eq!(sample_sum(text, "z"), None);
    }
}
