{
  "format": "vlad.signature/2",
  "key_id": "b5ee11b70294dcc0",
  "algorithm": "ed25519",
  "signature": "K3omcMWNLz6XMShOGHW9YZP/Y0AJcfNWGI4GQBxoHTv48VeUheVzdM1jNuFcdZibnYtIUrIoani3+WzpkALIDA==",
  "signed_at": "2026-12-03T06:48:01Z",
  "manifest_sha256": "e45aff2fbcf03b4158601c1add54fa5a1af9c9d0de63b7b35f415f13bbdcbecb"
}
