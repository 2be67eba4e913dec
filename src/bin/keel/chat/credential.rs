//! The bearer credential a chat through a server sends (the server's token,
//! an API key or a JWT), and what the chat says when the server refuses it.

use anyhow::Context;
use reqwest::StatusCode;

use super::ChatArgs;

/// The bearer credential: `--token-file`'s token, `--api-key`, or else
/// `KEEL_API_KEY`, or else `KEEL_TOKEN`.
pub(super) fn bearer(args: &ChatArgs) -> anyhow::Result<Option<String>> {
    if let Some(path) = &args.token_file {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("cannot read the token file {}", path.display()))?;
        let token = text.trim();
        anyhow::ensure!(!token.is_empty(), "the token file {} is empty", path.display());
        return Ok(Some(token.to_owned()));
    }
    if let Some(key) = &args.api_key {
        let key = key.trim();
        anyhow::ensure!(!key.is_empty(), "--api-key is empty");
        return Ok(Some(key.to_owned()));
    }
    Ok(["KEEL_API_KEY", "KEEL_TOKEN"]
        .into_iter()
        .filter_map(|name| std::env::var(name).ok())
        .map(|value| value.trim().to_owned())
        .find(|value| !value.is_empty()))
}

/// What the chat says when the server refused the credential (`401`) or
/// found it lacks a scope (`403 missing_scope_…`); `None` for any other
/// answer.
pub(super) fn refusal(status: StatusCode, code: &str, message: &str) -> Option<String> {
    if status == StatusCode::UNAUTHORIZED {
        return Some(format!(
            "the server refused the request (401 unauthorized): {message}; pass --api-key KEY (or set KEEL_API_KEY) \
             with a key or JWT it accepts, or --token-file FILE (or KEEL_TOKEN) with its token; a revoked or \
             expired key is refused too"
        ));
    }
    let scope = code.strip_prefix("missing_scope_")?;
    (status == StatusCode::FORBIDDEN).then(|| {
        format!(
            "this key lacks the `{scope}` scope (403 {code}): {message}; ask the operator for a key with it \
             (keel keys create --scopes …)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_name_the_credential_and_the_missing_scope() {
        let unauthorized = refusal(StatusCode::UNAUTHORIZED, "unauthorized", "no").expect("a 401");
        assert!(
            unauthorized.contains("401") && unauthorized.contains("--api-key"),
            "{unauthorized}"
        );
        let scope = refusal(StatusCode::FORBIDDEN, "missing_scope_submit", "no").expect("a 403");
        assert!(scope.starts_with("this key lacks the `submit` scope"), "{scope}");
        assert_eq!(refusal(StatusCode::FORBIDDEN, "sandbox_over_ceiling", "no"), None);
        assert_eq!(refusal(StatusCode::NOT_FOUND, "missing_scope_read", "no"), None);
    }
}
