//! Bounded label values: a [`LabelBudget`] keeps the first values a
//! client-chosen label takes and counts every later one as `other`.

use std::collections::HashSet;
use std::sync::Mutex;

/// Distinct bots that keep a label of their own in the model metrics.
pub(crate) const MAX_BOT_LABELS: usize = 32;

/// Distinct tenants that keep a label of their own in the budget metrics.
pub(crate) const MAX_TENANT_LABELS: usize = 64;

/// Distinct providers that keep a label of their own.
pub(crate) const MAX_PROVIDER_LABELS: usize = 16;

/// The label value standing for every value past a budget.
pub(crate) const OTHER_LABEL: &str = "other";

/// The values one label may take: the first `capacity` distinct values
/// asked for keep their own, every later one is [`OTHER_LABEL`], so the
/// label's series are bounded whatever clients send.
#[derive(Debug)]
pub(crate) struct LabelBudget {
    admitted: Mutex<HashSet<String>>,
    capacity: usize,
}

impl LabelBudget {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            admitted: Mutex::new(HashSet::new()),
            capacity,
        }
    }

    /// The label `value` is counted under.
    pub(crate) fn label(&self, value: &str) -> String {
        let mut admitted = self.admitted.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if value != OTHER_LABEL && (admitted.contains(value) || admitted.len() < self.capacity) {
            admitted.insert(value.to_owned());
            return value.to_owned();
        }
        OTHER_LABEL.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first values of a budget keep their label, later ones are
    /// `other`, and a value admitted stays admitted.
    #[test]
    fn a_label_budget_keeps_its_first_values_and_counts_the_rest_as_other() {
        let budget = LabelBudget::new(2);
        assert_eq!(budget.label("a"), "a");
        assert_eq!(budget.label("b"), "b");
        assert_eq!(budget.label("c"), OTHER_LABEL);
        assert_eq!(budget.label("a"), "a");
        assert_eq!(budget.label(OTHER_LABEL), OTHER_LABEL);
    }
}
