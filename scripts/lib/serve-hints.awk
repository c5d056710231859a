# Passes krause-server's log through unchanged and, when the server says "serving", prints the
# commands to try next (scripts/serve.sh). What it prints comes from the log itself: the ports
# from the "listening on port ..." line, the models from the "model NAME version V: KIND ..."
# lines (a generate hint only if a generator is served, a classify hint only with a classifier;
# the REST example names the default classifier, else the first model; the web page's address
# when the server serves it).
#   -v client=build/bin/krause-client   the client binary the hints name
{
  print
  fflush()
}
/ krause-server: listening on port [0-9]+/ {
  line = $0
  sub(/.* krause-server: listening on port /, "", line)
  grpc = line
  sub(/[^0-9].*/, "", grpc)
  tls = (line ~ /^[0-9]+ \(TLS\)/)
  if (match(line, /REST \(v2\) on port [0-9]+/)) {
    rest = substr(line, RSTART, RLENGTH)
    sub(/.* /, "", rest)
  }
  web = (line ~ /REST \(v2\) on port [0-9]+[^,]* with the web page at \//)
  if (match(line, /\/metrics on port [0-9]+/)) {
    metrics = substr(line, RSTART, RLENGTH)
    sub(/.* /, "", metrics)
  }
}
/ krause-server: model [^ ]+ version [0-9]+: (generator|classifier) / {
  line = $0
  sub(/.* krause-server: model /, "", line)
  split(line, w, " ")
  name = w[1]
  kind = w[4]
  if (first_model == "") first_model = name
  if (kind == "generator") generators++
  if (kind == "classifier") {
    classifiers++
    if (line ~ /, default \(/ || classifier == "") classifier = name
  }
}
function hint(command, why) {
  n++
  cmd[n] = command
  note[n] = why
  if (length(command) > width) width = length(command)
}
/ krause-server: serving$/ && !shown {
  shown = 1
  if (client == "") client = "build/bin/krause-client"
  c = client
  if (grpc != "" && grpc != "50051") c = c " --server localhost:" grpc
  if (tls) c = c " --tls"
  hint(c " list", "the models and what they cost")
  if (generators) hint(c " generate --num 4 --seed 7 --out samples", "4 images into samples/")
  if (generators && classifiers) hint(c " classify samples/sample-0.png", "what the classifier sees")
  example = classifier != "" ? classifier : first_model
  if (rest != "" && example != "")
    hint("curl localhost:" rest "/v2/models/" example, "the REST API (Open Inference Protocol)")
  if (rest != "" && web) hint("http://localhost:" rest "/", "the web page, in a browser")
  if (metrics != "") hint("curl localhost:" metrics "/metrics", "Prometheus metrics")
  hint(client " --help", "every option (docs/serving.md: everything else)")
  print ""
  print "krause-server is serving; Ctrl-C drains and stops it. Try, from another shell:"
  for (i = 1; i <= n; i++) printf "  %-" width "s   # %s\n", cmd[i], note[i]
  if (tls) print "  (TLS: add --tls_ca FILE for a private CA, and --token_file FILE with tokens)"
  print ""
  fflush()
}
