{
  "format": "vlad.signature/1",
  "key_id": "b5ee11b70294dcc0",
  "algorithm": "ed25519",
  "signature": "ppPXe3lhHv4lg1yr5PS2v31LPwra1gU5bmRVZAQqW8ZRmphRxk7X1Qm+qm7eUqL83pSnvAHJj1Pf/RTOKBELBQ==",
  "signed_at": "2026-12-02T11:54:33Z",
  "manifest_sha256": "97783efe8db9b7bc007a45b2ba573977071af96443a0855b45e45494d67b1f40"
}
