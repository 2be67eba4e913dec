"""Makes an identity provider's keys and tokens for Keel's JWT tests, with
PyJWT and cryptography: an implementation other than the one Keel
verifies with, so that a bug shared by both sides cannot make them agree.

Usage: mint_tokens.py DIR ISSUER AUDIENCE
Writes DIR/jwks.json (the public keys) and prints one JSON object mapping
case names to tokens.
"""

import base64
import hashlib
import hmac
import json
import sys
import time

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from jwt.algorithms import ECAlgorithm, OKPAlgorithm, RSAAlgorithm


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def public_jwk(algorithm, key, kid: str, alg: str) -> dict:
    jwk = json.loads(algorithm.to_jwk(key.public_key()))
    jwk.update({"kid": kid, "alg": alg, "use": "sig"})
    return jwk


def main() -> None:
    directory, issuer, audience = sys.argv[1:4]
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    ed_key = ed25519.Ed25519PrivateKey.generate()
    stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwks = {
        "keys": [
            public_jwk(RSAAlgorithm, rsa_key, "rsa-1", "RS256"),
            public_jwk(ECAlgorithm, ec_key, "ec-1", "ES256"),
            # No `alg`: chosen by the key's type.
            {k: v for k, v in public_jwk(OKPAlgorithm, ed_key, "ed-1", "EdDSA").items() if k != "alg"},
        ]
    }
    with open(f"{directory}/jwks.json", "w", encoding="utf-8") as out:
        json.dump(jwks, out)

    now = int(time.time())

    def claims(**changes):
        base = {
            "iss": issuer,
            "aud": audience,
            "sub": "alice@example.com",
            "org": "acme",
            "scope": "read submit",
            "iat": now,
            "exp": now + 600,
        }
        base.update(changes)
        return {k: v for k, v in base.items() if v is not None}

    def sign(key, alg, kid, **changes):
        return jwt.encode(claims(**changes), key, algorithm=alg, headers={"kid": kid})

    tokens = {
        "rs256": sign(rsa_key, "RS256", "rsa-1"),
        "es256": sign(ec_key, "ES256", "ec-1", sub="bob", org="globex", scope=["approve", "read"]),
        "eddsa": jwt.encode(claims(sub="carol", scope="admin unknown"), ed_key, algorithm="EdDSA"),
        "expired": sign(rsa_key, "RS256", "rsa-1", iat=now - 7200, exp=now - 3600),
        "not_yet_valid": sign(rsa_key, "RS256", "rsa-1", nbf=now + 3600),
        "wrong_audience": sign(rsa_key, "RS256", "rsa-1", aud="someone-else"),
        "wrong_issuer": sign(rsa_key, "RS256", "rsa-1", iss="https://evil.example"),
        "wrong_key": sign(stranger, "RS256", "rsa-1"),
        "wrong_key_no_kid": jwt.encode(claims(), stranger, algorithm="RS256"),
        "no_exp": sign(rsa_key, "RS256", "rsa-1", exp=None),
        "no_tenant": sign(rsa_key, "RS256", "rsa-1", org=None),
        "no_scope": sign(rsa_key, "RS256", "rsa-1", sub="dave", scope=None),
        "alg_none": jwt.encode(claims(), None, algorithm="none"),
        # Tenant names: any printable ASCII but `%` is one (one grammar for
        # every door); the operator's own `default` is nobody's to claim.
        "tenant_colon": sign(rsa_key, "RS256", "rsa-1", org="org:42"),
        "tenant_percent": sign(rsa_key, "RS256", "rsa-1", org="t%41"),
        "tenant_default": sign(rsa_key, "RS256", "rsa-1", org="default"),
        # Expires in 4 s: a stream it opens ends then, not a leeway later.
        "short_lived": sign(rsa_key, "RS256", "rsa-1", exp=now + 4),
    }
    # HS256 keyed with the RSA public key (PEM and JWK `n`): the classic
    # confusion. PyJWT refuses to make it, so it is made by hand.
    pem = rsa_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    for name, secret in (("hs256_public_pem", pem), ("hs256_public_n", jwks["keys"][0]["n"].encode())):
        head = b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}).encode())
        body = b64(json.dumps(claims()).encode())
        mac = hmac.new(secret, f"{head}.{body}".encode(), hashlib.sha256).digest()
        tokens[name] = f"{head}.{body}.{b64(mac)}"
    # A valid token whose payload is changed after signing (another tenant).
    head, _, signature = tokens["rs256"].split(".")
    tokens["tampered"] = f"{head}.{b64(json.dumps(claims(org='globex')).encode())}.{signature}"
    print(json.dumps(tokens))


if __name__ == "__main__":
    main()
