{
  "format": "vlad.signature/2",
  "key_id": "b5ee11b70294dcc0",
  "algorithm": "ed25519",
  "signature": "pqhyQ8knJETKh6LFThuOIGhz2xcDOi0RwOAxLXPmy5MFpTq7meOTrOnv2+5NjAET45KcKnOpUHIl1P3Ry9MMBQ==",
  "signed_at": "2026-12-06T03:13:25Z",
  "manifest_sha256": "924788496bd58bc7bf76dfce10b8b9cf64762c6decfabdfe8a5ccb0364395eec"
}
