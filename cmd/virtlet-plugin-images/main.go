// Command virtlet-plugin-images is the image plugin shipped with Virtlet:
// it downloads VM disk images over https.
package main

import (
	"github.com/virtlet/virtlet/adapters/imagesource"
	"github.com/virtlet/virtlet/plugins/sdk"
)

func main() { sdk.Serve(imagesource.New(sdk.Log)) }
