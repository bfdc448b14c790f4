//! Label selectors as scale-downs carry them: structured in a ReplicaSet's or Deployment's
//! `spec.selector`, and as a string in a Scale's `status.selector` (`app=web,tier in (a,b)`).

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::{Expression, Selector as KubeSelector};

/// A selector's requirements, all of which a pod's labels must meet. The structured form is
/// kube-core's; the string form has no parser there, so it is parsed here into the same
/// expressions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector(Vec<Expression>);

impl Selector {
    /// Whether a pod with these labels is selected. An empty selector selects nothing here:
    /// busyguard never acts on "every pod in the namespace".
    pub fn matches<'a>(&self, label: impl Fn(&str) -> Option<&'a str>) -> bool {
        !self.0.is_empty()
            && self.0.iter().all(|expression| match expression {
                Expression::In(key, values) => label(key).is_some_and(|v| values.contains(v)),
                Expression::NotIn(key, values) => label(key).is_none_or(|v| !values.contains(v)),
                Expression::Equal(key, value) => label(key) == Some(value.as_str()),
                Expression::NotEqual(key, value) => label(key) != Some(value.as_str()),
                Expression::Exists(key) => label(key).is_some(),
                Expression::DoesNotExist(key) => label(key).is_none(),
            })
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn from_label_selector(selector: &LabelSelector) -> Result<Self, SelectorError> {
        let selector = KubeSelector::try_from(selector.clone()).map_err(|e| SelectorError(e.to_string()))?;
        Ok(Selector(selector.into_iter().collect()))
    }
}

/// A selector that does not parse, and why: a scale-down with one is let through unprepared.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(pub String);

impl std::str::FromStr for Selector {
    type Err = SelectorError;

    /// The string form the API server writes: `k=v`, `k==v`, `k!=v`, `k in (a,b)`,
    /// `k notin (a,b)`, `k`, `!k`, separated by commas.
    fn from_str(text: &str) -> Result<Self, SelectorError> {
        let unparsed = |part: &str| SelectorError(format!("cannot parse {part:?} in {text:?}"));
        split_top_level(text)
            .into_iter()
            .filter(|part| !part.trim().is_empty())
            .map(|part| parse_requirement(part.trim()).ok_or_else(|| unparsed(part)))
            .collect::<Result<_, _>>()
            .map(Selector)
    }
}

/// Splits on the commas that are not inside `( )`.
fn split_top_level(text: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0i32, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

fn parse_requirement(part: &str) -> Option<Expression> {
    let valid_key = |key: &str| !key.is_empty() && !key.contains(|c: char| c.is_whitespace() || "=!(),".contains(c));
    if let Some(key) = part.strip_prefix('!') {
        return valid_key(key.trim()).then(|| Expression::DoesNotExist(key.trim().to_string()));
    }
    if let Some((key, value)) = part.split_once("!=") {
        return valid_key(key.trim()).then(|| Expression::NotEqual(key.trim().to_string(), value.trim().into()));
    }
    if let Some((key, value)) = part.split_once('=') {
        let value = value.strip_prefix('=').unwrap_or(value).trim();
        return (valid_key(key.trim()) && !value.contains(['=', '(', ')', ' ']))
            .then(|| Expression::Equal(key.trim().to_string(), value.to_string()));
    }
    let mut words = part.splitn(2, char::is_whitespace);
    let key = words.next()?.trim();
    let Some(rest) = words.next().map(str::trim) else {
        return valid_key(key).then(|| Expression::Exists(key.to_string()));
    };
    let (operator, list) = rest.split_once('(')?;
    let values: BTreeSet<String> = list.strip_suffix(')')?.split(',').map(|v| v.trim().to_string()).collect();
    if !valid_key(key) || values.iter().any(String::is_empty) {
        return None;
    }
    match operator.trim() {
        "in" => Some(Expression::In(key.to_string(), values)),
        "notin" => Some(Expression::NotIn(key.to_string(), values)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn labels(pairs: &[(&'static str, &'static str)]) -> impl Fn(&str) -> Option<&'static str> {
        let map: BTreeMap<&str, &str> = pairs.iter().copied().collect();
        move |key| map.get(key).copied()
    }

    #[test]
    fn string_selectors_of_every_form_parse_and_match() {
        let pod = labels(&[("app", "worker"), ("tier", "b"), ("pod-template-hash", "6b8958b477")]);
        for (text, expected) in [
            ("app=worker", true),
            ("app==worker,pod-template-hash=6b8958b477", true),
            ("app=web", false),
            ("app!=web", true),
            ("tier in (a, b)", true),
            ("tier notin (a,b)", false),
            ("app,!canary", true),
            ("!app", false),
            ("app=worker, tier in (c)", false),
        ] {
            let selector: Selector = text.parse().unwrap();
            assert_eq!(selector.matches(&pod), expected, "{text}");
        }
    }

    #[test]
    fn nonsense_selectors_are_refused() {
        for text in ["app=(x", "tier in a,b", "tier in ()", "a b c", "=x", "tier between (a)"] {
            assert!(text.parse::<Selector>().is_err(), "{text}");
        }
    }

    #[test]
    fn empty_selector_selects_nothing() {
        let selector: Selector = "".parse().unwrap();
        assert!(selector.is_empty());
        assert!(!selector.matches(labels(&[("app", "worker")])));
    }

    #[test]
    fn structured_selectors_match_like_the_string_form() {
        let structured: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchLabels": {"app": "worker"},
            "matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]},
                                 {"key": "canary", "operator": "DoesNotExist"}]}))
        .unwrap();
        let selector = Selector::from_label_selector(&structured).unwrap();
        let pods = [
            (labels(&[("app", "worker"), ("tier", "a")]), true),
            (labels(&[("app", "worker"), ("tier", "c")]), false),
            (labels(&[("app", "worker"), ("tier", "b"), ("canary", "1")]), false),
            (labels(&[("tier", "a")]), false),
        ];
        let string: Selector = "app=worker,tier in (a,b),!canary".parse().unwrap();
        for (pod, selected) in pods {
            assert_eq!(selector.matches(&pod), selected);
            assert_eq!(string.matches(&pod), selected, "the string form selects the same");
        }
        let bad: LabelSelector = serde_json::from_value(serde_json::json!({
            "matchExpressions": [{"key": "tier", "operator": "Between", "values": ["a"]}]}))
        .unwrap();
        assert!(Selector::from_label_selector(&bad).is_err());
    }
}
