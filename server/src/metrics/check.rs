//! A strict reading of a metrics page, for tests: `prometheus-parse` parses it, and every
//! line must be a HELP, TYPE or sample line of the Prometheus text format (0.0.4), whole and
//! in its place, so a malformed page fails the test that reads it. (The format allows other
//! comments and blank lines; the encoder writes none, and a `# EOF` would mean OpenMetrics
//! leaked onto a 0.0.4 page, so they are refused too.)

use std::collections::{HashMap, HashSet};

use prometheus_parse::{LineInfo, Scrape, Value};

/// A family on the page: its name and its `# TYPE`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Family {
    /// The name on its `# TYPE` line.
    pub name: String,
    /// `counter`, `gauge`, `histogram`, `summary` or `untyped`.
    pub kind: String,
}

/// The page, parsed.
#[derive(Debug)]
pub(crate) struct Page {
    /// Every family, in page order.
    pub families: Vec<Family>,
    /// prometheus-parse's reading of it.
    pub scrape: Scrape,
}

impl Page {
    /// The value of the sample `name` with `labels` (`name`, `value` pairs).
    pub(crate) fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.scrape.samples.iter().find_map(|s| {
            let same_labels = s.labels.len() == labels.len()
                && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v));
            (s.metric == name && same_labels).then_some(match s.value {
                Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
                _ => f64::NAN,
            })
        })
    }
}

/// Parses `page`, or says which line breaks the format and why.
pub(crate) fn parse(page: &str) -> Result<Page, String> {
    let body = page
        .strip_suffix('\n')
        .ok_or("the page is empty or its last line has no newline")?;
    let mut help: HashSet<&str> = HashSet::new();
    let mut types: HashMap<&str, &str> = HashMap::new();
    let mut families = Vec::new();
    let mut series: HashSet<String> = HashSet::new();
    // The family whose samples come now (they must be contiguous, after its TYPE).
    let mut current: Option<&str> = None;
    let mut plain_samples = 0_usize;
    for (n, line) in body.split('\n').enumerate() {
        let at = |why: &str| format!("line {}: {why}: {line:?}", n + 1);
        match LineInfo::parse(line) {
            LineInfo::Doc { metric_name, doc } => {
                if line != format!("# HELP {metric_name} {doc}") || !name_ok(metric_name) {
                    return Err(at("a malformed HELP line"));
                }
                if !help.insert(metric_name) {
                    return Err(at("a second HELP for this family"));
                }
                if current != Some(metric_name) && types.contains_key(metric_name) {
                    return Err(at("HELP after the family's samples"));
                }
            }
            LineInfo::Type { .. } => {
                let mut words = line.split(' ');
                let (Some("#"), Some("TYPE"), Some(name), Some(kind), None) = (
                    words.next(),
                    words.next(),
                    words.next(),
                    words.next(),
                    words.next(),
                ) else {
                    return Err(at("a malformed TYPE line"));
                };
                if !name_ok(name)
                    || !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind)
                {
                    return Err(at("a malformed TYPE line"));
                }
                if types.insert(name, kind).is_some() {
                    return Err(at("a second TYPE for this family"));
                }
                families.push(Family {
                    name: name.to_owned(),
                    kind: kind.to_owned(),
                });
                current = Some(name);
            }
            LineInfo::Sample {
                metric_name,
                labels,
                value,
                timestamp,
            } => {
                let rebuilt = match labels {
                    Some(l) => format!("{metric_name}{{{l}}} {value}"),
                    None => format!("{metric_name} {value}"),
                };
                if line != rebuilt || timestamp.is_some() {
                    return Err(at("a sample that is not `name{labels} value`"));
                }
                let family = current.ok_or_else(|| at("a sample before any TYPE"))?;
                if !belongs(metric_name, family, types.get(family).copied()) {
                    return Err(at("a sample outside its family's TYPE"));
                }
                if !go_float(value) {
                    return Err(at("a value that is not a number"));
                }
                if let Some(l) = labels {
                    labels_ok(l).map_err(|why| at(&why))?;
                }
                if !series.insert(format!("{metric_name}{{{}}}", labels.unwrap_or(""))) {
                    return Err(at("a second sample of this series"));
                }
                if matches!(types.get(family), Some(&"counter" | &"gauge")) {
                    plain_samples += 1;
                }
            }
            LineInfo::Empty | LineInfo::Ignored => {
                return Err(at("neither HELP, TYPE nor a sample"));
            }
        }
    }
    if let Some(family) = families.iter().find(|f| !help.contains(f.name.as_str())) {
        return Err(format!("family {} has no HELP", family.name));
    }
    let scrape = Scrape::parse(body.split('\n').map(|l| Ok(l.to_owned())))
        .map_err(|e| format!("prometheus-parse: {e}"))?;
    // prometheus-parse reads counters and gauges sample by sample (histograms it groups, and
    // their `_sum` and `_count` it leaves untyped): each of those must be read, and typed.
    let read: Vec<_> = scrape
        .samples
        .iter()
        .filter(|s| matches!(types.get(s.metric.as_str()), Some(&"counter" | &"gauge")))
        .collect();
    if read.len() != plain_samples {
        return Err(format!(
            "prometheus-parse read {} counter and gauge samples of {plain_samples}",
            read.len()
        ));
    }
    if let Some(untyped) = read.iter().find(|s| matches!(s.value, Value::Untyped(_))) {
        return Err(format!("sample {} has no type", untyped.metric));
    }
    Ok(Page { families, scrape })
}

/// `[a-zA-Z_:][a-zA-Z0-9_:]*`.
fn name_ok(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_' || b == b':')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
}

/// True when sample `name` is one of `family`'s, given its type.
fn belongs(name: &str, family: &str, kind: Option<&str>) -> bool {
    match kind {
        Some("histogram") => ["_bucket", "_sum", "_count"]
            .iter()
            .any(|s| name.strip_suffix(s) == Some(family)),
        Some("summary") => {
            name == family
                || ["_sum", "_count"]
                    .iter()
                    .any(|s| name.strip_suffix(s) == Some(family))
        }
        _ => name == family,
    }
}

/// A Go float: a decimal number, `NaN`, `+Inf` or `-Inf`.
fn go_float(text: &str) -> bool {
    matches!(text, "NaN" | "+Inf" | "-Inf")
        || (text.parse::<f64>().is_ok_and(f64::is_finite)
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)))
}

/// `name="value",...` with label names `[a-zA-Z_][a-zA-Z0-9_]*`, values escaped (`\\`,
/// `\"`, `\n`), no name twice.
fn labels_ok(labels: &str) -> Result<(), String> {
    let mut seen = HashSet::new();
    let mut rest = labels;
    loop {
        let (name, after) = rest
            .split_once("=\"")
            .ok_or_else(|| format!("label {rest:?} is not name=\"value\""))?;
        if !name_ok(name) || name.contains(':') || !seen.insert(name) {
            return Err(format!("bad or repeated label name {name:?}"));
        }
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\' | '"' | 'n')) => {}
                    _ => return Err(format!("bad escape in label {name}")),
                },
                Some((i, '"')) => break i,
                Some((_, '\n')) | None => return Err(format!("unterminated label {name}")),
                Some(_) => {}
            }
        };
        rest = &after[end + 1..];
        match rest.strip_prefix(',') {
            Some("") => return Ok(()),
            Some(next) => rest = next,
            None if rest.is_empty() => return Ok(()),
            None => return Err(format!("junk after label {name}: {rest:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "# HELP a_total A.\n# TYPE a_total counter\na_total 1\n\
                        # HELP b B.\n# TYPE b gauge\nb{x=\"1\",y=\"a\\\"b\"} 2\nb{x=\"2\"} 3\n";

    #[test]
    fn a_well_formed_page_is_read() {
        let page = parse(GOOD).map_err(|e| e.to_string());
        let page = match page {
            Ok(page) => page,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(page.families.len(), 2);
        assert_eq!(page.value("a_total", &[]), Some(1.0));
        assert_eq!(page.value("b", &[("x", "2")]), Some(3.0));
    }

    /// Each of these pages breaks the format once; each must be refused.
    #[test]
    fn malformed_pages_are_refused() {
        for (bad, why) in [
            ("", "empty"),
            ("# HELP a A.\n# TYPE a gauge\na 1", "no final newline"),
            ("# HELP a A.\n# TYPE a gauge\na one\n", "value"),
            ("# HELP a A.\n# TYPE a gauge\na 1 2 3\n", "trailing junk"),
            ("# HELP a A.\n# TYPE a gauge\na{x=1} 1\n", "unquoted label"),
            (
                "# HELP a A.\n# TYPE a gauge\na{x=\"1\",x=\"2\"} 1\n",
                "repeated label",
            ),
            (
                "# HELP a A.\n# TYPE a gauge\na{x=\"1\"\n",
                "unclosed labels",
            ),
            (
                "# HELP a A.\n# TYPE a gauge\na 1\na 2\n",
                "duplicate series",
            ),
            (
                "# HELP a A.\n# TYPE a gauge\nb 1\n",
                "sample outside its family",
            ),
            ("a 1\n", "sample without TYPE"),
            ("# TYPE a gauge\na 1\n", "no HELP"),
            (
                "# HELP a A.\n# TYPE a gauge\n# TYPE a gauge\na 1\n",
                "two TYPEs",
            ),
            ("# HELP a A.\n# TYPE a gauge\n\na 1\n", "blank line"),
            (
                "# HELP a A.\n# TYPE a gauge\na 1\n# EOF\n",
                "a comment (OpenMetrics' end)",
            ),
            ("# HELP a A.\n# TYPE a countr\na 1\n", "unknown type"),
            (
                GOOD.replace("a_total 1", "a_total 1\nb 9").as_str(),
                "non-contiguous",
            ),
        ] {
            assert!(parse(bad).is_err(), "{why}: {bad:?} was accepted");
        }
    }
}
