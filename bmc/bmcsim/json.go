package bmcsim

import (
	"encoding/json"
	"net/http"
)

func odataID(p string) map[string]string { return map[string]string{"@odata.id": p} }

func refs(paths []string) []map[string]string {
	out := make([]map[string]string, len(paths))
	for i, p := range paths {
		out[i] = odataID(p)
	}
	return out
}

func status() map[string]string { return map[string]string{"State": "Enabled", "Health": "OK"} }

func collection(id, typ, name string, members []string) map[string]any {
	return map[string]any{"@odata.id": id, "@odata.type": typ, "Name": name,
		"Members": refs(members), "Members@odata.count": len(members)}
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("OData-Version", "4.0")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, msgID, msg string) {
	writeJSON(w, code, map[string]any{"error": map[string]any{
		"code": msgID, "message": msg,
		"@Message.ExtendedInfo": []map[string]any{{"MessageId": msgID, "Message": msg, "Severity": "Warning"}},
	}})
}
