{
  "format": "vlad.signature/2",
  "key_id": "b5ee11b70294dcc0",
  "algorithm": "ed25519",
  "signature": "KV10JmtWpbhyQZHKtH2KcmlPSsvJzYtAK3tnNVngnqEUGk892ujEH4wEoQchUtUtLojrf/bZ33hmIRdkLk2gAA==",
  "signed_at": "2026-12-06T09:33:52Z",
  "manifest_sha256": "cd9ca1d2e99ec067561605688f46e0d3b2f875386629d95d5bcf8ca82be3c96f"
}
