{
  "format": "vlad.signature/2",
  "key_id": "b5ee11b70294dcc0",
  "algorithm": "ed25519",
  "signature": "wqae9N2pwProS2aNDuzZjjGxqQjwrqPLD8qq7Fui5m6H3lH+waXtvWnSTDUJOCeNHM8CO3YqT11CrYXhIO9bBw==",
  "signed_at": "2026-12-04T08:52:31Z",
  "manifest_sha256": "bd6550dc78e4cbfedc00784e91f5ed65ea81ff300c0a9ec1c7a34677bdbb6f50"
}
