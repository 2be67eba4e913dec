//! A run's history against the session's thread: whether the history
//! before the new messages is the session's (what `409 history_mismatch`
//! names).

use super::events::Message;

/// The request's history must be the session's: the same roles and texts,
/// but for an assistant message its turn broke off (`broke_off`): the
/// client may have kept any beginning of its text (the deltas it got
/// before the cut), or none of it.
/// `history` is the request's, as (role, text); the error says where the
/// two fork.
pub(super) fn compare(
    history: &[(&str, &str)],
    session: &[&Message],
    broke_off: impl Fn(&Message) -> bool,
) -> Result<(), String> {
    let mut next = 0;
    for &(role, text) in history {
        loop {
            let Some(have) = session.get(next) else {
                return Err(format!(
                    "the history forks from the session's at message {}: the session's history ends before it, \
                     the request's goes on with the {role} message {}",
                    next + 1,
                    excerpt(text)
                ));
            };
            next += 1;
            if broke_off(have) {
                if role == have.role() && have.text().starts_with(text) {
                    break;
                }
                // The client has none of it.
                continue;
            }
            if role != have.role() || text != have.text() {
                return Err(format!(
                    "the history forks from the session's at message {next}: the session has the {} message {}, \
                     the request the {role} message {}",
                    have.role(),
                    excerpt(have.text()),
                    excerpt(text)
                ));
            }
            break;
        }
    }
    if let Some((index, have)) = session.iter().enumerate().skip(next).find(|(_, have)| !broke_off(have)) {
        return Err(format!(
            "the history forks from the session's at message {}: the request's history ends before it, the \
             session's goes on with the {} message {}",
            index + 1,
            have.role(),
            excerpt(have.text())
        ));
    }
    Ok(())
}

fn excerpt(text: &str) -> String {
    const MAX: usize = 60;
    if text.chars().count() <= MAX {
        format!("{text:?}")
    } else {
        format!("{:?}…", text.chars().take(MAX).collect::<String>())
    }
}
