//! Audit mode (`--mode audit`): a trial that changes nothing. Every request is answered as it
//! came: a refusal becomes its warning and a `would-deny` line, a patch a `would-patch` line
//! naming what enforce mode would have written, and no workload budget is claimed. The side
//! effects go on to the outbox, which withholds them in this mode (`cluster::outbox`).
//!
//! Two keys of busyguard's own are still written, which no controller but busyguard reads: the
//! busy label where busyguard itself writes it (a pod opted in by an owner rule, a
//! run-to-completion pod: without it the trial would not see those pods' tasks at all), and
//! busy-since, so the trial can tell how far into its task each pod taken was.

use jiff::Timestamp;
use json_patch::{Patch, PatchOperation};

use super::{Answer, Decision, Outcome, Reason};
use crate::policy::ask::Ask;
use crate::policy::config::Mode;
use crate::policy::keys::{BUSY_LABEL, BUSY_SINCE};

impl Outcome {
    /// This outcome as audit mode answers it (see the module's comment).
    pub fn in_audit_mode(self, ask: &Ask<'_>, now: Timestamp) -> Outcome {
        let Outcome { answer, decision, audit, effects, .. } = self;
        let outcome = match answer {
            Answer::Deny { message, .. } => {
                let audit = audit.map(|mut record| {
                    record.decision = Decision::WouldDeny;
                    record
                });
                let allowed = Answer::Allow { warnings: vec![super::would_deny(&message)] };
                Outcome { audit, ..Outcome::answer(allowed, Decision::WouldDeny) }
            }
            Answer::Patch { patch, warnings } => {
                let (kept, withheld) = split_own_keys(patch);
                let answer = match kept.0.is_empty() {
                    true => Answer::Allow { warnings },
                    false => Answer::Patch { patch: kept, warnings },
                };
                if withheld.0.is_empty() {
                    Outcome { audit, ..Outcome::answer(answer, decision) }
                } else {
                    // A line of its own already (a restart let through, another writer's overwrite) is kept.
                    let audit = audit.unwrap_or_else(|| {
                        let detail = format!("enforce mode would write: {}", described(&withheld));
                        Box::new(ask.audit(Decision::WouldPatch, Reason::BusyMarks, detail, Mode::Audit, now))
                    });
                    Outcome::answer(answer, Decision::WouldPatch).audited(audit)
                }
            }
            allowed => Outcome { audit, ..Outcome::answer(allowed, decision) },
        };
        Outcome { effects, ..outcome }
    }
}

/// busyguard's own keys, kept in audit mode: the busy label where busyguard writes it, and
/// busy-since, which the trial's summary reads; no controller but busyguard reads either.
const KEPT: [(&str, &str); 2] = [("labels", BUSY_LABEL), ("annotations", BUSY_SINCE)];

/// The operations on busyguard's own keys alone ([`KEPT`]: set, replaced or removed), and the
/// rest. A map added whole (a pod without labels or annotations) is split by key.
fn split_own_keys(patch: Patch) -> (Patch, Patch) {
    let (mut kept, mut withheld) = (Vec::new(), Vec::new());
    for operation in patch.0 {
        if on_own_key(&operation) {
            kept.push(operation);
            continue;
        }
        let PatchOperation::Add(add) = operation else {
            withheld.push(operation);
            continue;
        };
        let own_key = KEPT.iter().find(|(map, _)| add.path.as_str() == format!("/metadata/{map}"));
        let (Some((_, key)), serde_json::Value::Object(map)) = (own_key, &add.value) else {
            withheld.push(PatchOperation::Add(add));
            continue;
        };
        let (ours, rest): (serde_json::Map<_, _>, _) = map.clone().into_iter().partition(|(k, _)| k == key);
        let part = |map: serde_json::Map<String, serde_json::Value>| {
            PatchOperation::Add(json_patch::AddOperation { path: add.path.clone(), value: map.into() })
        };
        kept.extend((!ours.is_empty()).then(|| part(ours)));
        withheld.extend((!rest.is_empty()).then(|| part(rest)));
    }
    (Patch(kept), Patch(withheld))
}

/// Whether the operation writes one of busyguard's own keys ([`KEPT`]) and nothing else.
fn on_own_key(operation: &PatchOperation) -> bool {
    let path = match operation {
        PatchOperation::Add(op) => &op.path,
        PatchOperation::Replace(op) => &op.path,
        PatchOperation::Remove(op) => &op.path,
        _ => return false,
    };
    KEPT.iter().any(|(map, key)| path.as_str() == format!("/metadata/{map}/{}", key.replace('/', "~1")))
}

/// A patch in one line: `add /metadata/annotations/karpenter.sh~1do-not-disrupt="true", ...`.
fn described(patch: &Patch) -> String {
    let each = patch.0.iter().map(|operation| match operation {
        PatchOperation::Add(op) => format!("add {}={}", op.path, op.value),
        PatchOperation::Replace(op) => format!("replace {}={}", op.path, op.value),
        PatchOperation::Remove(op) => format!("remove {}", op.path),
        other => format!("{other:?}"),
    });
    each.collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::outcome::Denial;
    use crate::policy::testing::{ask as request, now};
    use json_patch::AddOperation;

    fn ask(username: &'static str) -> Ask<'static> {
        request("UPDATE", username)
    }

    fn add(path: &str, value: serde_json::Value) -> PatchOperation {
        PatchOperation::Add(AddOperation { path: path.parse().unwrap(), value })
    }

    #[test]
    fn a_refusal_is_allowed_with_its_warning_and_audited_would_deny() {
        let alice = ask("alice");
        let message = "pod w/x is busy".to_string();
        let denied =
            Outcome::answer(Answer::Deny { denial: Denial::PodBusy, message: message.clone() }, Decision::Denied)
                .audited(alice.audit(Decision::Denied, Reason::Busy, message, Mode::Audit, now()));
        let trial = denied.in_audit_mode(&alice, now());
        assert_eq!(
            trial.answer,
            Answer::Allow { warnings: vec!["busyguard audit mode, would deny: pod w/x is busy".into()] }
        );
        assert_eq!(trial.decision, Decision::WouldDeny);
        assert_eq!(trial.audit.unwrap().decision, Decision::WouldDeny);
    }

    /// A mutating answer with these operations, as audit mode answers it.
    fn patched(operations: Vec<PatchOperation>) -> Outcome {
        let patch = Answer::Patch { patch: Patch(operations), warnings: vec![] };
        Outcome::answer(patch, Decision::Patched).in_audit_mode(&ask("alice"), now())
    }

    /// The answer that writes these operations alone.
    fn writes(operations: Vec<PatchOperation>) -> Answer {
        Answer::Patch { patch: Patch(operations), warnings: vec![] }
    }

    #[test]
    fn a_flips_marks_are_not_written_but_audited_would_patch() {
        let trial = patched(vec![
            add("/metadata/annotations/karpenter.sh~1do-not-disrupt", "true".into()),
            add("/metadata/labels/busyguard.io~1protected", "true".into()),
        ]);
        assert_eq!(trial.answer, Answer::Allow { warnings: vec![] }, "nothing written");
        assert_eq!(trial.decision, Decision::WouldPatch);
        let audit = trial.audit.unwrap();
        assert_eq!((audit.decision, audit.reason), (Decision::WouldPatch, Reason::BusyMarks));
        assert_eq!(
            audit.detail,
            "enforce mode would write: add /metadata/annotations/karpenter.sh~1do-not-disrupt=\"true\", \
             add /metadata/labels/busyguard.io~1protected=\"true\""
        );
    }

    #[test]
    fn a_patch_with_a_line_of_its_own_keeps_that_line_when_its_marks_are_withheld() {
        let alice = ask("alice");
        let detail = "pod w/x's protection lapsed: busy past its max-busy".to_string();
        let restarted = Outcome::answer(
            writes(vec![add("/metadata/annotations/karpenter.sh~1do-not-disrupt", "true".into())]),
            Decision::Patched,
        )
        .audited(alice.audit(Decision::Lapsed, Reason::MaxBusyExceeded, detail.clone(), Mode::Audit, now()));
        let trial = restarted.in_audit_mode(&alice, now());
        assert_eq!(trial.answer, Answer::Allow { warnings: vec![] }, "nothing written");
        assert_eq!(trial.decision, Decision::WouldPatch);
        let audit = trial.audit.unwrap();
        assert_eq!((audit.decision, audit.reason, audit.detail), (Decision::Lapsed, Reason::MaxBusyExceeded, detail));
    }

    #[test]
    fn busyguards_own_busy_label_is_still_written_and_nothing_else() {
        let opted_in = add("/metadata/labels", serde_json::json!({BUSY_LABEL: "false"}));
        let trial = patched(vec![opted_in.clone()]);
        assert_eq!(trial.answer, writes(vec![opted_in]));
        assert!(trial.audit.is_none(), "nothing withheld, nothing to audit");

        let busy_label = add("/metadata/labels/busyguard.io~1busy", "true".into());
        let cost = add("/metadata/annotations/controller.kubernetes.io~1pod-deletion-cost", "1000".into());
        let trial = patched(vec![busy_label.clone(), cost]);
        assert_eq!(trial.answer, writes(vec![busy_label]));
        assert_eq!(trial.decision, Decision::WouldPatch);
    }

    #[test]
    fn busy_since_is_kept_out_of_a_whole_annotations_map_and_the_rest_withheld() {
        let map = serde_json::json!({BUSY_SINCE: "2026-12-01T10:00:00Z", "karpenter.sh/do-not-disrupt": "true"});
        let trial = patched(vec![add("/metadata/annotations", map)]);
        let kept = add("/metadata/annotations", serde_json::json!({BUSY_SINCE: "2026-12-01T10:00:00Z"}));
        assert_eq!(trial.answer, writes(vec![kept]));
        assert_eq!(
            trial.audit.unwrap().detail,
            "enforce mode would write: add /metadata/annotations={\"karpenter.sh/do-not-disrupt\":\"true\"}"
        );
    }

    #[test]
    fn a_flip_to_idle_takes_busy_since_off_and_leaves_the_cost_as_it_is() {
        use json_patch::{RemoveOperation, ReplaceOperation};
        let since = PatchOperation::Remove(RemoveOperation {
            path: "/metadata/annotations/busyguard.io~1busy-since".parse().unwrap(),
        });
        let cost = PatchOperation::Replace(ReplaceOperation {
            path: "/metadata/annotations/controller.kubernetes.io~1pod-deletion-cost".parse().unwrap(),
            value: "0".into(),
        });
        let trial = patched(vec![since.clone(), cost]);
        assert_eq!(trial.answer, writes(vec![since]));
        assert_eq!(trial.decision, Decision::WouldPatch);
        assert_eq!(
            trial.audit.unwrap().detail,
            "enforce mode would write: replace /metadata/annotations/controller.kubernetes.io~1pod-deletion-cost=\"0\""
        );
    }

    #[test]
    fn no_budget_is_claimed_in_audit_mode() {
        let alice = ask("alice");
        let refusal = Box::new(Outcome::allow(Decision::Allowed));
        let claim = super::super::BudgetClaim {
            namespace: "w".into(),
            pod: "x".into(),
            workload: "ReplicaSet/r".into(),
            unavailable: vec![],
            allowed: 1,
            refusal,
        };
        let claimed = Outcome { budget: Some(Box::new(claim)), ..Outcome::allow(Decision::Allowed) };
        assert!(claimed.in_audit_mode(&alice, now()).budget.is_none());
    }
}
