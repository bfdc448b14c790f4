//! From a decoded AdmissionRequest to the policy's Outcome: each request's route read once
//! (`paths`), and one function per route (`routes`) that reads the objects, builds the typed
//! input of the one policy file that decides its path, and looks up the view where the request
//! does not carry the pod. No decision is made here.

pub mod objects;
pub mod paths;
pub mod review;
pub mod routes;

use jiff::Timestamp;

pub use paths::{Resource, Route, Webhook};
use review::AdmissionRequest;
pub use routes::{DecisionInputs, Unanswerable};

use crate::policy::Mode;
use crate::policy::outcome::{Decision, Outcome};

/// The request's route, and its answer.
pub fn admit(
    request: &AdmissionRequest,
    webhook: Webhook,
    inputs: &DecisionInputs<'_>,
    now: Timestamp,
) -> Result<Outcome, Unanswerable> {
    let ask = routes::ask(request);
    let outcome = match Route::of(webhook, Resource::of(request), request.operation) {
        Route::PodMutate => routes::pod_mutate(request, &ask, inputs, now),
        Route::PodResize => routes::pod_resize(request, &ask, inputs, now),
        Route::PodWriteCheck => routes::pod_write_check(request, &ask, inputs, now),
        Route::PodDelete => routes::pod_delete(request, &ask, inputs, now),
        Route::PodEviction => routes::pod_eviction(request, &ask, inputs, now),
        Route::ScaleDown => routes::scale_down(request, &ask, inputs, now),
        Route::NodeDelete => routes::node_delete(request, &ask, inputs, now),
        Route::NodeClaimDelete => routes::node_claim_delete(request, &ask, inputs, now),
        Route::OwnerUpdate => routes::owner_update(request, &ask, inputs, now),
        Route::Unhandled => Ok(Outcome::allow(Decision::Unhandled)),
    }?;
    Ok(match inputs.policy.mode {
        Mode::Enforce => outcome,
        Mode::Audit => outcome.in_audit_mode(&ask, now),
    })
}
