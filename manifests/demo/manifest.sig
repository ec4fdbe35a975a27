{
  "format": "vlad.signature/2",
  "key_id": "b5ee11b70294dcc0",
  "algorithm": "ed25519",
  "signature": "UPuc2NZ60YIDmEXiJrOJbmV6M10tiBNj87ezKrlLPOt5vRPvGa8jSYn+J0711WNSi84VO8agRn+PQX0EDA2oBQ==",
  "signed_at": "2026-12-04T13:16:54Z",
  "manifest_sha256": "82d2cb63a3872e9b20990ff65bd4cdccf9cd6c24822e0f004f72cb415d422764"
}
